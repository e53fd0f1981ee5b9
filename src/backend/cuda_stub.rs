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

/// The benchmark's interface without the `cuda` feature: `run` and `startup` fail with
/// [`Error::CudaNotCompiled`].
pub mod bench {
    use crate::error::{Error, Result};

    /// Benchmark settings (see the `cuda` build).
    #[derive(Debug, Clone)]
    pub struct BenchOptions {
        /// CUDA device ordinal.
        pub device_id: u32,
        /// Timed iterations per figure.
        pub iterations: u32,
        /// Untimed iterations first.
        pub warmup: u32,
        /// Also time variants of the fused kernel.
        pub variants: bool,
        /// Frame size cases to run, by index; empty: all.
        pub cases: Vec<usize>,
        /// conv2d kernel sizes to time; empty: none.
        pub conv_sizes: Vec<u32>,
        /// Read frames from this directory and write the tensors there.
        pub frames_dir: Option<std::path::PathBuf>,
        /// Gaussian conv2d size of the frame figures; 0: none.
        pub frame_conv: u32,
    }

    /// Benchmark output (see the `cuda` build).
    #[derive(Debug, Clone)]
    pub struct BenchReport {
        /// Machine-readable results.
        pub json: serde_json::Value,
        /// Human-readable table.
        pub table: String,
    }

    /// Always [`Error::CudaNotCompiled`].
    pub fn run(_opts: &BenchOptions) -> Result<BenchReport> {
        Err(Error::CudaNotCompiled)
    }

    /// Always [`Error::CudaNotCompiled`].
    pub fn startup(
        _device_id: u32,
        _cache_dir: Option<&std::path::Path>,
        _frame: (u32, u32),
        _on_ready: &mut dyn FnMut(&serde_json::Value),
    ) -> Result<serde_json::Value> {
        Err(Error::CudaNotCompiled)
    }
}
