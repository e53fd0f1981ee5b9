//! What the pipeline does when its backend fails with a CUDA error
//! (`gpu_failure_policy`). The fault injection that exercises it is in `fault.rs`
//! (feature `fault-injection`).
//!
//! The policy lives here, in the pipeline, so the node and the no-ROS GPU drill
//! (`test/gpu_fault.rs`) run the same code: the node only reports what happened.

use crate::backend::Backend;
use crate::config::{BackendChoice, Config, GpuFailurePolicy};
use crate::error::Result;
use std::time::Duration;

/// CUDA backend rebuilds `retry` tries before falling back to the CPU.
pub const GPU_RETRY_ATTEMPTS: u32 = 3;
/// Wait before each rebuild attempt (a device that just faulted may need a moment, e.g.
/// while the driver recovers from an Xid error).
pub const GPU_RETRY_BACKOFF: [Duration; GPU_RETRY_ATTEMPTS as usize] =
    [Duration::ZERO, Duration::from_millis(200), Duration::from_millis(1000)];
/// Consecutive good frames on a rebuilt backend after which its rebuild attempts are
/// forgotten: a GPU that fails again and again within this many frames uses up the
/// attempts and ends on the CPU instead of being rebuilt forever.
pub const GPU_RETRY_RESET_FRAMES: u64 = 100;

/// Opens a new backend for `retry` (the pipeline's configuration is passed in).
pub type BackendOpener = Box<dyn FnMut(&Config) -> Result<Box<dyn Backend>> + Send>;

/// What the policy did about a backend failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureAction {
    /// `fallback`: now on the CPU backend.
    FellBack,
    /// `retry`: a new backend was built (on attempt `attempt` of
    /// [`GPU_RETRY_ATTEMPTS`]) and ran the frame.
    Rebuilt {
        /// 1-based attempt that worked.
        attempt: u32,
    },
    /// `retry`: the attempts left were used up without a working backend (`attempts`
    /// were made for this failure; 0 when earlier failures had used them all); now on
    /// the CPU backend.
    RetriesExhausted {
        /// Rebuild attempts made for this failure.
        attempts: u32,
        /// Why the last attempt failed (empty when none was made).
        last_error: String,
    },
}

/// A backend failure the pipeline recovered from (under `exit`, the frame's error is
/// [`Error::GpuFailure`] instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFailure {
    /// The failed backend's error.
    pub reason: String,
    /// What was done.
    pub action: FailureAction,
    /// The backend that ran the frame afterwards ("cpu" or "cuda").
    pub backend: &'static str,
    /// Messages taken out on the failed backend's buffers ([`super::Pipeline::take_message`])
    /// that were still being published when it was replaced, after waiting
    /// [`super::OUTSTANDING_WAIT`] (normally 0; more: a new GPU backend may fail to open
    /// until they are done).
    pub unreturned_messages: usize,
}

impl std::fmt::Display for GpuFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.action {
            FailureAction::FellBack => {
                write!(f, "gpu_failure_policy fallback: switched to the {} backend", self.backend)
            }
            FailureAction::Rebuilt { attempt } => write!(
                f,
                "gpu_failure_policy retry: rebuilt the {} backend (attempt {attempt} of \
                 {GPU_RETRY_ATTEMPTS})",
                self.backend
            ),
            FailureAction::RetriesExhausted { attempts: 0, .. } => write!(
                f,
                "gpu_failure_policy retry: no rebuild attempts left ({GPU_RETRY_ATTEMPTS} used \
                 within {GPU_RETRY_RESET_FRAMES} frames); switched to the {} backend",
                self.backend
            ),
            FailureAction::RetriesExhausted { attempts, last_error } => write!(
                f,
                "gpu_failure_policy retry: {attempts} rebuild attempt(s) failed (last: \
                 {last_error}); switched to the {} backend",
                self.backend
            ),
        }
    }
}

/// The pipeline's failure-handling state.
pub(crate) struct Recovery {
    pub(crate) policy: GpuFailurePolicy,
    pub(crate) opener: BackendOpener,
    /// The test hook's plan (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub(crate) injection: super::fault::Injection,
    /// Frames handed to a backend so far (the current one included).
    pub(crate) frame: u64,
    /// Rebuild attempts used since the last [`GPU_RETRY_RESET_FRAMES`] good frames.
    pub(crate) attempts_used: u32,
    /// Consecutive good frames since the last failure.
    pub(crate) good_frames: u64,
    /// On the CPU after a failure: no more recovery (and no more injection).
    pub(crate) fell_back: bool,
}

impl Recovery {
    pub(crate) fn new(config: &Config) -> Self {
        Recovery {
            policy: config.gpu_failure_policy,
            opener: Box::new(default_opener),
            #[cfg(feature = "fault-injection")]
            injection: super::fault::Injection::default(),
            frame: 0,
            attempts_used: 0,
            good_frames: 0,
            fell_back: false,
        }
    }

    /// A frame ran without a failure.
    pub(crate) fn good_frame(&mut self) {
        self.good_frames += 1;
        if self.good_frames >= GPU_RETRY_RESET_FRAMES {
            self.attempts_used = 0;
        }
    }
}

/// Opens a backend of the kind the configuration asks for: CUDA for `cuda` and `auto`
/// (the pipeline only rebuilds a backend that was CUDA, or a simulated one in tests),
/// the CPU for `cpu`.
fn default_opener(config: &Config) -> Result<Box<dyn Backend>> {
    match config.backend {
        BackendChoice::Cpu => Ok(Box::new(crate::backend::cpu::CpuBackend::new())),
        BackendChoice::Cuda | BackendChoice::Auto => {
            crate::backend::cuda::CudaBackend::open(config.device_id, config.memory_mode)
        }
    }
}
