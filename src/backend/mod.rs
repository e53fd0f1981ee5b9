//! Backends compute one function, defined by the CPU backend (the specification) and
//! reproduced by the CUDA backend. They know nothing of ROS or of the configuration
//! file: the pipeline resolves everything into the plain operation structs of [`ops`].

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;
pub mod ops;

use crate::error::Result;
#[cfg(feature = "fault-injection")]
use crate::error::{CudaError, Error};
use crate::image::ImageView;
pub use ops::{
    read_element, read_elements, write_element, AxisMap, Conv2dOp, PreprocessOp, PreprocessParams,
    TensorDesc,
};

/// Time spent in each stage of one frame, in microseconds. A stage a backend does not
/// have is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    /// Copy of the frame into the backend's input buffer.
    pub upload_us: f32,
    /// The fused decode + resize + pad + normalize + layout pass.
    pub preprocess_us: f32,
    /// conv2d.
    pub conv_us: f32,
    /// Copy of the tensor back to host memory.
    pub download_us: f32,
}

/// A compute backend.
pub trait Backend: Send {
    /// "cpu" or "cuda", as published in `FrameTiming.backend`.
    fn name(&self) -> &'static str;

    /// A human-readable description of the device (CPU threads, GPU name and clock).
    fn device_description(&self) -> String;

    /// Extra facts for `/diagnostics` as (key, value), e.g. the GPU clock and memory
    /// mode. None by default.
    fn diagnostics(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Run the preprocessing (and conv2d, when given) on `image`, writing the finished
    /// tensor's bytes (`op.params.tensor_desc()`, little-endian) into `out`, which is
    /// resized to fit.
    fn process(
        &mut self,
        image: &ImageView<'_>,
        op: &PreprocessOp,
        conv: Option<&Conv2dOp>,
        out: &mut Vec<u8>,
    ) -> Result<StageTimes>;

    /// Test hook (feature `fault-injection`; `VISION_PREPROC_INJECT_CUDA_FAULT`, see
    /// `pipeline::FaultPlan`): make the device fail the way a real fault of `kind` does
    /// and return the error the failed frame gets. The CUDA backend causes a real fault;
    /// a backend without a device returns a simulated CUDA error, so the failure policy
    /// can be exercised without a GPU.
    #[cfg(feature = "fault-injection")]
    fn inject_fault(&mut self, kind: FaultKind) -> Error {
        Error::Cuda(CudaError::Driver {
            call: format!("injected {kind:?} fault (VISION_PREPROC_INJECT_CUDA_FAULT, test only)"),
            message: format!("simulated on the {} backend, which has no device", self.name()),
        })
    }
}

/// Test hook (feature `fault-injection`): which real device failure
/// [`Backend::inject_fault`] causes.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A kernel's illegal memory access: a sticky error, after which every call on the
    /// context fails (CUDA: "the process must be terminated and relaunched").
    Sticky,
    /// An allocation the device cannot satisfy (out of memory, as when another process
    /// took the memory): the call fails, the context stays usable.
    Transient,
}
