//! Test hook (feature `fault-injection`, off in the product): make the backend fail on a
//! chosen frame, as `VISION_PREPROC_INJECT_CUDA_FAULT` or [`super::Pipeline::inject_fault`]
//! say, so that `gpu_failure_policy` (`failure.rs`) can be exercised: by the node in
//! `test/ros/test_gpu_failure.py` (CPU, simulated), `test/gpu_policy.rs` and on a GPU by
//! `test/gpu_fault.rs` (a real fault).

pub use crate::backend::FaultKind;
use crate::error::{Error, Result};

/// The environment variable of the fault injection, read by [`super::Pipeline::new`].
pub(crate) const INJECT_FAULT_ENV: &str = "VISION_PREPROC_INJECT_CUDA_FAULT";

/// When and how to make the backend fail (`VISION_PREPROC_INJECT_CUDA_FAULT`).
/// Frames are numbered from 1 in the order the pipeline hands them to a backend (frames
/// rejected before that, e.g. invalid images, are not counted).
///
/// The variable's forms: `N` (frame N fails once), `N..` (frame N and every later attempt
/// fails, the re-runs of a failed frame on a rebuilt backend included: a GPU that stays
/// broken, until the pipeline falls back to the CPU), each optionally followed by
/// `:sticky` (the default: a kernel's illegal address), `:transient` (out of memory) or
/// `:in_flight` (an illegal address in the set's own GPU work, after it was submitted:
/// a shared block's `TensorRef` has gone out, docs/HANDOFF.md).
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
                 optionally followed by :sticky (default), :transient or :in_flight; unset it \
                 outside tests",
            )
        };
        let t = text.trim();
        let (frames, kind) = match t.split_once(':') {
            Some((f, "sticky")) => (f, FaultKind::Sticky),
            Some((f, "transient")) => (f, FaultKind::Transient),
            Some((f, "in_flight")) => (f, FaultKind::InFlight),
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
    pub(crate) fn from_env() -> Result<Option<Self>> {
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

/// The pipeline's injection state: the plan, and whether a one-time fault has fired.
#[derive(Debug, Default)]
pub(crate) struct Injection {
    plan: Option<FaultPlan>,
    fired: bool,
}

impl Injection {
    pub(crate) fn new(plan: Option<FaultPlan>) -> Self {
        Injection { plan, fired: false }
    }

    /// The fault the attempt to run frame `frame` (1-based) must fail with, if any; none
    /// once the pipeline has fallen back to the CPU.
    pub(crate) fn due(&mut self, frame: u64, fell_back: bool) -> Option<FaultKind> {
        let plan = self.plan?;
        if fell_back {
            return None;
        }
        if plan.persistent && frame >= plan.at {
            return Some(plan.kind);
        }
        if !plan.persistent && !self.fired && frame == plan.at {
            self.fired = true;
            return Some(plan.kind);
        }
        None
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
        assert_eq!(
            FaultPlan::parse("200:in_flight").unwrap(),
            FaultPlan::once(200, FaultKind::InFlight)
        );
        for bad in ["0", "", "x", "3..4", "-1", "0..", "3:", "3:hard", ":transient"] {
            let e = FaultPlan::parse(bad).unwrap_err().to_string();
            assert!(e.contains(INJECT_FAULT_ENV) && e.contains("N.."), "{bad}: {e}");
        }
    }
}
