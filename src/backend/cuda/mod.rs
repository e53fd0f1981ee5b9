//! The CUDA backend (work in progress: the fused kernel lands with the CUDA issue).
//! Until then, constructing it reports the GPU as unavailable, so `backend: auto` uses
//! the CPU and `backend: cuda` fails at start-up with a clear message.

use crate::backend::Backend;
use crate::config::MemoryMode;
use crate::error::{CudaError, Result};

/// The CUDA backend.
pub enum CudaBackend {}

impl CudaBackend {
    /// Open device `device_id`.
    pub fn open(_device_id: u32, _memory_mode: MemoryMode) -> Result<Box<dyn Backend>> {
        Err(CudaError::Unavailable("the CUDA backend is not implemented in this build yet".into())
            .into())
    }
}
