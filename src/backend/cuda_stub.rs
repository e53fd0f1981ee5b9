//! Stand-in for the CUDA backend when the `cuda` feature is off: every constructor fails
//! with [`Error::CudaNotCompiled`], so `backend: auto` falls back to the CPU.

use crate::config::MemoryMode;
use crate::error::{Error, Result};

/// Never constructed without the `cuda` feature.
pub enum CudaBackend {}

impl CudaBackend {
    /// Always [`Error::CudaNotCompiled`].
    pub fn open(
        _device_id: u32,
        _memory_mode: MemoryMode,
    ) -> Result<Box<dyn crate::backend::Backend>> {
        Err(Error::CudaNotCompiled)
    }
}
