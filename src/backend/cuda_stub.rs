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

/// Stand-in for the CUDA backend's `vmm` (device memory shared with other processes).
pub mod vmm {
    use crate::error::{Error, Result};
    use std::os::fd::RawFd;

    /// Never constructed without the `cuda` feature: a consumer process cannot import a
    /// pool's CUDA blocks.
    pub(crate) enum ImportedBlocks {}

    impl ImportedBlocks {
        /// Always [`Error::CudaNotCompiled`].
        pub(crate) fn import(_fds: &[RawFd], _block_size: usize, _device_id: i32) -> Result<Self> {
            Err(Error::CudaNotCompiled)
        }

        pub(crate) fn len(&self) -> usize {
            match *self {}
        }

        pub(crate) fn is_empty(&self) -> bool {
            match *self {}
        }

        pub(crate) fn block_size(&self) -> usize {
            match *self {}
        }

        pub(crate) fn address(&self, _i: usize) -> u64 {
            match *self {}
        }

        pub(crate) fn device_id(&self) -> i32 {
            match *self {}
        }

        pub(crate) fn uuid(&self) -> [u8; 16] {
            match *self {}
        }

        pub(crate) fn copy_to_host(
            &self,
            _i: usize,
            _offset: usize,
            _out: &mut [u8],
        ) -> Result<()> {
            match *self {}
        }

        pub(crate) fn wait_ipc_event(
            &self,
            _handle: &[u8],
            _still_valid: &dyn Fn() -> bool,
            _timeout: std::time::Duration,
        ) -> Result<bool> {
            match *self {}
        }

        pub(crate) fn synchronize(&self) -> Result<()> {
            match *self {}
        }
    }
}

/// Without the `cuda` feature there is no CUDA backend, so no JPEG decoder of its own.
pub fn jpeg_decoder() -> String {
    "no CUDA backend in this build (cargo feature `cuda`)".to_string()
}
