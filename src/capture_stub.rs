//! Stand-in for `capture` when the `gstreamer` feature is off: the types the node's inputs
//! use exist, and [`CaptureSource::start`] refuses every `gst:` input by name with
//! [`Error::Capture`] (as `backend/cuda_stub.rs` does for CUDA). `Config::validate`
//! already refuses `gst:` inputs in such a build, so the node never gets here; its code
//! for pipeline inputs compiles the same with and without GStreamer.

use crate::error::{CaptureError, Error, Result};
use crate::image::{DeviceContext, DeviceView, Encoding, ImageView, LentReads};
use std::sync::Arc;
use std::time::Duration;

/// Why a `gst:` input cannot run in this build, and the fix.
const NOT_COMPILED: &str = "this build has no GStreamer: build with the cargo feature \
                            `gstreamer` (a default one), or subscribe to a topic";

/// What `vision_preproc info` says of GStreamer in this build.
pub fn status() -> String {
    "not in this build (cargo feature `gstreamer`): no `gst:` inputs".to_string()
}

/// What `vision_preproc info` says of GStreamer's CUDA memory in this build.
pub fn cuda_status() -> String {
    "not in this build (cargo feature `gstreamer`)".to_string()
}

/// The caps feature of GStreamer's CUDA memory (as with GStreamer).
pub const CUDA_MEMORY_FEATURE: &str = "memory:CUDAMemory";

/// Never constructed without the `gstreamer` feature.
pub enum GpuShare {}

impl GpuShare {
    /// Always refused: no GStreamer in this build.
    pub fn new(_device: DeviceContext) -> std::result::Result<Arc<GpuShare>, String> {
        Err(NOT_COMPILED.to_string())
    }
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
    pub fn view(&self) -> Option<ImageView<'_>> {
        match *self {}
    }

    /// Never called: no frame exists.
    pub fn device(&self) -> Option<DeviceView<'_>> {
        match *self {}
    }

    /// Never called: no frame exists.
    pub fn width(&self) -> u32 {
        match *self {}
    }

    /// Never called: no frame exists.
    pub fn height(&self) -> u32 {
        match *self {}
    }

    /// Never called: no frame exists.
    pub fn encoding(&self) -> Encoding {
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
    pub fn pts_ns(&self) -> Option<u64> {
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
        CaptureSource::start_on(description, None)
    }

    /// Always [`Error::Capture`] naming `description` and the cargo feature.
    pub fn start_on(description: &str, _gpu: Option<Arc<GpuShare>>) -> Result<CaptureSource> {
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

// The video inputs' plain data, as with GStreamer (one definition).
#[path = "capture/video_types.rs"]
mod video_types;
pub use video_types::{DecoderChoice, Outcome, Packet, Step, VideoCounts, VideoReport};

/// What `vision_preproc info` says of the video decoders in this build.
pub fn decoders_status(_policy: crate::config::VideoDecoder) -> String {
    "none: this build has no GStreamer (cargo feature `gstreamer`)".to_string()
}

/// A video input's feed without GStreamer: every packet refused by name and counted.
/// (`Config::validate` refuses the video transports in such a build; a compressed input's
/// H.264 message can still arrive.)
#[derive(Debug, Default)]
pub struct VideoFeed {
    report: std::sync::Mutex<VideoReport>,
}

impl VideoFeed {
    /// A feed that refuses every packet.
    pub fn new(_policy: crate::config::VideoDecoder, _limits: crate::compressed::Limits) -> Self {
        VideoFeed::default()
    }

    /// No decode pipeline to share it with.
    pub fn with_gpu(self, _gpu: Option<Arc<GpuShare>>) -> Self {
        self
    }

    /// Refused: no decoder in this build.
    pub fn push(&self, _packet: &Packet<'_>) -> Outcome {
        let mut r = self.report.lock().unwrap_or_else(|p| p.into_inner());
        r.counts.received += 1;
        *r.counts.refused.entry("no decoder").or_default() += 1;
        Outcome::Refused(NOT_COMPILED.to_string())
    }

    /// Never a pipeline.
    pub fn take_started(&self, timeout: Duration) -> Option<(CaptureSource, u64)> {
        std::thread::sleep(timeout);
        None
    }

    /// Never called: no pipeline runs.
    pub fn fault(&self, _generation: u64, _what: &str) -> bool {
        false
    }

    /// Nothing to wait for: no stream is decoded.
    pub fn pause(&self) {}

    /// Nothing to end: no stream is decoded.
    pub fn finish(&self) {}

    /// Never called: no frame is decoded.
    pub fn decoded(&self) {}

    /// Nothing in a decoder: no packet is decoded.
    pub fn in_decoder(&self) -> u64 {
        0
    }

    /// No frame_id: no frame is decoded.
    pub fn frame_id(&self) -> String {
        String::new()
    }

    /// The counts (every packet refused).
    pub fn report(&self) -> VideoReport {
        self.report.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A video input's frames without GStreamer: none (every packet was refused).
#[derive(Debug)]
pub struct VideoFrames;

impl VideoFrames {
    /// No frames: no pipeline runs.
    pub fn new(_feed: Arc<VideoFeed>) -> VideoFrames {
        VideoFrames
    }

    /// Waits `wait`: nothing comes.
    pub fn step(&mut self, wait: Duration) -> Step<Frame> {
        std::thread::sleep(wait);
        Step::Idle
    }

    /// Always: no pipeline runs.
    pub fn is_idle(&self) -> bool {
        true
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
