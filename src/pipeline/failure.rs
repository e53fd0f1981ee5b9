//! Which backend runs the pipeline: the one `backend` selects at the start
//! ([`select_backend`]) and what replaces it when it fails with a CUDA error
//! (`gpu_failure_policy`: the pipeline's `recover`). The fault injection that exercises
//! it is in `fault.rs` (feature `fault-injection`).
//!
//! The policy lives here, in the pipeline, so the node and the no-ROS GPU drill
//! (`test/gpu_fault.rs`) run the same code: the node only reports what happened.

use super::inflight::{Others, PendingState};
use super::Pipeline;
use crate::backend::{self, Backend, StageTimes};
use crate::config::{BackendChoice, Config, GpuFailurePolicy};
use crate::error::{Error, Result};
use crate::handoff::Pool;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// CUDA backend rebuilds `retry` tries before falling back to the CPU.
pub const GPU_RETRY_ATTEMPTS: u32 = 3;
/// Wait before each rebuild attempt (a device that just faulted may need a moment, e.g.
/// while the driver recovers from an Xid error).
pub(crate) const GPU_RETRY_BACKOFF: [Duration; GPU_RETRY_ATTEMPTS as usize] =
    [Duration::ZERO, Duration::from_millis(200), Duration::from_millis(1000)];
/// Consecutive good frames on a rebuilt backend after which its rebuild attempts are
/// forgotten: a GPU that fails again and again within this many frames uses up the
/// attempts and ends on the CPU instead of being rebuilt forever.
pub const GPU_RETRY_RESET_FRAMES: u64 = 100;

/// Opens a new backend for `retry` (the pipeline's configuration is passed in).
pub(crate) type BackendOpener = Box<dyn FnMut(&Config) -> Result<Box<dyn Backend>> + Send>;

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
    /// Messages taken out on the failed backend's buffers (`super::Pipeline::take_message`)
    /// that were still being published when it was replaced, after waiting
    /// `super::OUTSTANDING_WAIT` (normally 0; more: a new GPU backend may fail to open
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
/// the CPU for `cpu`. The default [`BackendOpener`].
fn default_opener(config: &Config) -> Result<Box<dyn Backend>> {
    match config.backend {
        BackendChoice::Cpu => Ok(Box::new(backend::cpu::CpuBackend::new())),
        BackendChoice::Cuda | BackendChoice::Auto => {
            let mut b = backend::cuda::CudaBackend::open(config.device_id, config.memory_mode)?;
            b.prepare_decoding(config.compressed_inputs())?;
            Ok(b)
        }
    }
}

/// Pick the backend for `cfg.backend`. Returns the backend and, when `auto` fell back
/// to the CPU, the reason (for a warning and a diagnostics note).
pub fn select_backend(cfg: &Config) -> Result<(Box<dyn Backend>, Option<String>)> {
    #[cfg(feature = "fault-injection")]
    if cfg.backend == BackendChoice::Cpu {
        if let Some(deferred) = super::deferred::Deferred::from_env() {
            return Ok((Box::new(deferred), None));
        }
    }
    match default_opener(cfg) {
        Err(e) if cfg.backend == BackendChoice::Auto => {
            Ok((Box::new(backend::cpu::CpuBackend::new()), Some(e.to_string())))
        }
        opened => Ok((opened?, None)),
    }
}

/// [`select_backend`], saying through `warn` when `backend: auto` fell back to the CPU
/// (the node logs it as a warning, the CLI prints it); the reason is returned too (for a
/// diagnostics note).
pub fn open_backend(
    cfg: &Config,
    warn: impl FnOnce(&str),
) -> Result<(Box<dyn Backend>, Option<String>)> {
    let (backend, fallback) = select_backend(cfg)?;
    if let Some(reason) = &fallback {
        warn(&format!("backend auto: no usable GPU, using the CPU backend ({reason})"));
    }
    Ok((backend, fallback))
}

/// Every set in flight among `others` is abandoned (the backend waited for and forgot
/// them after a device error): each runs again at its finish.
pub(super) fn abandon(others: &mut dyn Others) {
    others.each(&mut |p| {
        if matches!(p.state, PendingState::InFlight) {
            p.state = PendingState::Abandoned;
        }
    });
}

impl Pipeline {
    /// A pool of `count` shared output blocks of at least `bytes` for this pipeline's
    /// backend, its socket in `dir` (docs/HANDOFF.md): device memory where the backend can
    /// share it, else host memory, with the reason when the backend has a device whose
    /// memory it could not share. A device pool is released when the backend is replaced
    /// (see `Pipeline::backend_epoch`).
    pub fn shared_pool(
        &self,
        count: usize,
        bytes: usize,
        lease: Duration,
        dir: &Path,
    ) -> Result<(Arc<Pool>, Option<String>)> {
        let why = match self.backend.shared_blocks(count, bytes) {
            Ok(Some(blocks)) => {
                let pool = Pool::device(blocks, lease, dir)?;
                let mut pools = self.device_pools.lock().unwrap_or_else(|p| p.into_inner());
                pools.retain(|w| w.strong_count() > 0);
                pools.push(Arc::downgrade(&pool));
                return Ok((pool, None));
            }
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        };
        Ok((Pool::host(count, bytes, lease, dir)?, why))
    }

    /// How many times the backend was replaced (`gpu_failure_policy`): a pool of
    /// [`Pipeline::shared_pool`] made at another epoch is stale (a device pool is
    /// released; a new backend may offer device memory).
    pub(crate) fn backend_epoch(&self) -> u64 {
        self.epoch
    }

    /// Replace the backend. The message buffer goes first: it may be pinned memory that
    /// keeps the old backend's CUDA context alive. Returns how many messages taken out
    /// on the old backend's buffers were still not dropped after [`super::OUTSTANDING_WAIT`]
    /// (normally 0).
    pub(super) fn replace_backend(
        &mut self,
        backend: Box<dyn Backend>,
        others: &mut dyn Others,
    ) -> usize {
        self.backend.abandon_all();
        abandon(others);
        others.each(&mut |p| {
            p.message.release();
            // A set the failed backend refused (its context was already faulted) runs
            // again on the new one, as the abandoned ones do.
            if matches!(&p.state, PendingState::Failed(e) if e.is_device_failure()) {
                p.state = PendingState::Abandoned;
            }
        });
        self.message.release();
        let left = self.pool.retire();
        // Its device blocks go before the backend (they keep its context alive).
        let pools =
            std::mem::take(&mut *self.device_pools.lock().unwrap_or_else(|p| p.into_inner()));
        for pool in pools.iter().filter_map(Weak::upgrade) {
            pool.release_device();
        }
        self.backend = backend;
        self.epoch += 1;
        left
    }

    /// `gpu_failure_policy` after the backend failed on a set with `reason`: rebuild or
    /// replace the backend and run the set again (`run`), or give up (`exit`). `others`:
    /// the sets in flight after it, which a replaced backend abandons.
    pub(super) fn recover(
        &mut self,
        reason: String,
        others: &mut dyn Others,
        run: &mut dyn FnMut(&mut Self, &mut dyn Others) -> Result<StageTimes>,
    ) -> Result<(StageTimes, GpuFailure)> {
        use crate::config::GpuFailurePolicy as P;
        self.recovery.good_frames = 0;
        let mut unreturned = 0;
        let action = match self.recovery.policy {
            P::Exit => return Err(Error::GpuFailure { reason }),
            P::Fallback => FailureAction::FellBack,
            P::Retry => {
                let mut attempts = 0;
                let mut last_error = String::new();
                while self.recovery.attempts_used < GPU_RETRY_ATTEMPTS {
                    let backoff = GPU_RETRY_BACKOFF[self.recovery.attempts_used as usize];
                    self.recovery.attempts_used += 1;
                    attempts += 1;
                    std::thread::sleep(backoff);
                    // Drop the failed backend first: its context must be released before
                    // a new one can be made (a faulted CUDA context is reset when its last
                    // reference goes).
                    unreturned =
                        self.replace_backend(Box::new(backend::cpu::CpuBackend::new()), others);
                    match (self.recovery.opener)(&self.config) {
                        Ok(b) => {
                            self.replace_backend(b, others);
                        }
                        Err(e) => {
                            last_error = format!("opening a new backend: {e}");
                            continue;
                        }
                    }
                    match run(self, others) {
                        Ok(times) => {
                            let failure = GpuFailure {
                                reason,
                                action: FailureAction::Rebuilt { attempt: attempts },
                                backend: self.backend.name(),
                                unreturned_messages: unreturned,
                            };
                            return Ok((times, failure));
                        }
                        Err(e) if e.is_device_failure() => {
                            last_error = format!("the frame again: {e}")
                        }
                        Err(e) => return Err(e),
                    }
                }
                FailureAction::RetriesExhausted { attempts, last_error }
            }
        };
        let cpu = Box::new(backend::cpu::CpuBackend::new());
        unreturned = unreturned.max(self.replace_backend(cpu, others));
        self.recovery.fell_back = true;
        let times = run(self, others)?;
        let backend = self.backend.name();
        Ok((times, GpuFailure { reason, action, backend, unreturned_messages: unreturned }))
    }
}
