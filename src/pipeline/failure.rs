//! What the pipeline does when its backend fails with a CUDA error
//! (`gpu_failure_policy`), and the test-only fault injection that exercises it.
//!
//! The policy lives here, in the pipeline, so the node and the no-ROS GPU drill
//! (`test/gpu_fault.rs`) run the same code: the node only reports what happened.

use crate::backend::{Backend, FaultKind};
use crate::config::{BackendChoice, Config, GpuFailurePolicy};
use crate::error::{Error, Result};
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

/// The environment variable of the test-only fault injection.
pub const INJECT_FAULT_ENV: &str = "VISION_PREPROC_INJECT_CUDA_FAULT";

/// Opens a new backend for `retry` (the pipeline's configuration is passed in).
pub type BackendOpener = Box<dyn FnMut(&Config) -> Result<Box<dyn Backend>> + Send>;

/// TESTS ONLY: when and how to make the backend fail (`VISION_PREPROC_INJECT_CUDA_FAULT`).
/// Frames are numbered from 1 in the order the pipeline hands them to a backend (frames
/// rejected before that, e.g. invalid images, are not counted).
///
/// The variable's forms: `N` (frame N fails once), `N..` (frame N and every later attempt
/// fails, the re-runs of a failed frame on a rebuilt backend included: a GPU that stays
/// broken, until the pipeline falls back to the CPU), each optionally followed by
/// `:sticky` (the default: a kernel's illegal address) or `:transient` (out of memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultPlan {
    /// The first frame that fails.
    pub at: u64,
    /// Every attempt from `at` on fails, not only the first.
    pub persistent: bool,
    /// The fault.
    pub kind: FaultKind,
}

impl FaultPlan {
    /// Frame `at` fails once with `kind`.
    pub fn once(at: u64, kind: FaultKind) -> Self {
        FaultPlan { at, persistent: false, kind }
    }

    /// Every attempt from frame `at` on fails with `kind`.
    pub fn from(at: u64, kind: FaultKind) -> Self {
        FaultPlan { at, persistent: true, kind }
    }

    /// Parse `N`, `N..`, `N:sticky`, `N..:transient`, ... (N >= 1); the error names the
    /// variable and the forms.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            Error::config(
                INJECT_FAULT_ENV,
                format!("{text:?}"),
                "use N (frame N fails once) or N.. (every frame from N fails), N >= 1, \
                 optionally followed by :sticky (default) or :transient; unset it outside tests",
            )
        };
        let t = text.trim();
        let (frames, kind) = match t.split_once(':') {
            Some((f, "sticky")) => (f, FaultKind::Sticky),
            Some((f, "transient")) => (f, FaultKind::Transient),
            Some(_) => return Err(bad()),
            None => (t, FaultKind::Sticky),
        };
        let (number, persistent) = match frames.strip_suffix("..") {
            Some(n) => (n, true),
            None => (frames, false),
        };
        match number.parse::<u64>() {
            Ok(at) if at >= 1 => Ok(FaultPlan { at, persistent, kind }),
            _ => Err(bad()),
        }
    }

    /// The plan in the environment, if `VISION_PREPROC_INJECT_CUDA_FAULT` is set.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var(INJECT_FAULT_ENV) {
            Ok(v) => Self::parse(&v).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::config(
                INJECT_FAULT_ENV,
                format!("{v:?}"),
                "use N or N.. in ASCII digits",
            )),
        }
    }
}

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
    pub(crate) fault: Option<FaultPlan>,
    /// Whether `FaultPlan::Once` has fired.
    pub(crate) fired: bool,
    /// Frames handed to a backend so far (the current one included).
    pub(crate) frame: u64,
    /// Rebuild attempts used since the last [`GPU_RETRY_RESET_FRAMES`] good frames.
    pub(crate) attempts_used: u32,
    /// Consecutive good frames since the last failure.
    pub(crate) good_frames: u64,
    /// On the CPU after a failure: no more injection, no more recovery.
    pub(crate) fell_back: bool,
}

impl Recovery {
    pub(crate) fn new(config: &Config, fault: Option<FaultPlan>) -> Self {
        Recovery {
            policy: config.gpu_failure_policy,
            opener: Box::new(default_opener),
            fault,
            fired: false,
            frame: 0,
            attempts_used: 0,
            good_frames: 0,
            fell_back: false,
        }
    }

    /// The fault the attempt to run the current frame must fail with (injection), if any.
    pub(crate) fn fault_due(&mut self) -> Option<FaultKind> {
        let plan = self.fault?;
        if self.fell_back {
            return None;
        }
        if plan.persistent && self.frame >= plan.at {
            return Some(plan.kind);
        }
        if !plan.persistent && !self.fired && self.frame == plan.at {
            self.fired = true;
            return Some(plan.kind);
        }
        None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_plans_parse_and_bad_ones_name_the_variable() {
        assert_eq!(FaultPlan::parse("5").unwrap(), FaultPlan::once(5, FaultKind::Sticky));
        assert_eq!(FaultPlan::parse(" 12.. ").unwrap(), FaultPlan::from(12, FaultKind::Sticky));
        assert_eq!(
            FaultPlan::parse("3:transient").unwrap(),
            FaultPlan::once(3, FaultKind::Transient)
        );
        assert_eq!(FaultPlan::parse("7..:sticky").unwrap(), FaultPlan::from(7, FaultKind::Sticky));
        for bad in ["0", "", "x", "3..4", "-1", "0..", "3:", "3:hard", ":transient"] {
            let e = FaultPlan::parse(bad).unwrap_err().to_string();
            assert!(e.contains(INJECT_FAULT_ENV) && e.contains("N.."), "{bad}: {e}");
        }
    }
}
