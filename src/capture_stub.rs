//! Stand-in for `capture` when the `gstreamer` feature is off: the types the node's inputs
//! use exist, and [`CaptureSource::start`] refuses every `gst:` input by name with
//! [`Error::Capture`] (as `backend/cuda_stub.rs` does for CUDA). `Config::validate`
//! already refuses `gst:` inputs in such a build, so the node never gets here; its code
//! for pipeline inputs compiles the same with and without GStreamer.

use crate::error::{CaptureError, Error, Result};
use crate::image::{ImageView, LentReads};
use std::sync::Arc;
use std::time::Duration;

/// Why a `gst:` input cannot run in this build, and the fix.
const NOT_COMPILED: &str = "this build has no GStreamer: build with the cargo feature \
                            `gstreamer` (a default one), or subscribe to a topic";

/// What `vision_preproc info` says of GStreamer in this build.
pub fn status() -> String {
    "not in this build (cargo feature `gstreamer`): no `gst:` inputs".to_string()
}

/// No GStreamer, no threads of its own.
pub fn release_idle_threads() {}

// The same types as with GStreamer (one definition: plain data).
#[path = "capture/time.rs"]
mod time;
pub use time::{CaptureTime, ClockKind};

/// Never constructed without the `gstreamer` feature.
#[derive(Debug)]
pub enum Frame {}

impl Frame {
    /// Never called: no frame exists.
    pub fn view(&self) -> ImageView<'_> {
        match *self {}
    }

    /// Never called: no frame exists.
    pub fn is_lent(&self) -> bool {
        match *self {}
    }

    /// Never called: no frame exists.
    pub fn capture_time(&self) -> Option<&CaptureTime> {
        match *self {}
    }

    /// Never called: no frame exists.
    pub fn sequence(&self) -> u64 {
        match *self {}
    }

    /// Never called: no frame exists.
    pub fn copied(&self) -> bool {
        match *self {}
    }
}

/// Never constructed without the `gstreamer` feature.
pub enum CaptureSource {}

impl CaptureSource {
    /// Always [`Error::Capture`] naming `description` and the cargo feature.
    pub fn start(description: &str) -> Result<CaptureSource> {
        Err(Error::Capture {
            description: description.to_string(),
            fault: CaptureError::Init(NOT_COMPILED.to_string()),
        })
    }

    /// Never called: no source exists.
    pub fn count_reads_in(&mut self, _reads: Arc<LentReads>) {
        match *self {}
    }

    /// Never called: no source exists.
    pub fn next(&mut self, _timeout: Duration) -> Result<Option<Frame>> {
        match *self {}
    }

    /// Never called: no source exists.
    pub fn description(&self) -> &str {
        match *self {}
    }

    /// Never called: no source exists.
    pub fn is_live(&self) -> bool {
        match *self {}
    }

    /// Never called: no source exists.
    pub fn delivered(&self) -> u64 {
        match *self {}
    }

    /// Never called: no source exists.
    pub fn clock_now_ns(&self) -> Option<u64> {
        match *self {}
    }

    /// Never called: no source exists.
    pub fn pause(&mut self) -> Result<()> {
        match *self {}
    }

    /// Never called: no source exists.
    pub fn resume(&mut self) -> Result<()> {
        match *self {}
    }

    /// Never called: no source exists.
    pub fn stop(self) -> Result<()> {
        match self {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gst_input_is_refused_by_name_without_gstreamer() {
        let e = CaptureSource::start("videotestsrc").err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some(
                "inputs `gst:videotestsrc`: GStreamer cannot be initialized: this build has no \
                 GStreamer: build with the cargo feature `gstreamer` (a default one), or \
                 subscribe to a topic"
            )
        );
    }
}
