//! When a frame was captured ([`CaptureTime`]) and on which clock ([`ClockKind`]): plain
//! data, without GStreamer, so that the build without the feature `gstreamer` has the same
//! types (`capture_stub.rs` includes this file).

/// Which clock a [`CaptureTime`] is a time of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClockKind {
    /// GStreamer's system clock on `CLOCK_MONOTONIC` (its default).
    Monotonic,
    /// GStreamer's system clock on `CLOCK_REALTIME` (wall time, Unix epoch).
    Realtime,
    /// GStreamer's system clock on `CLOCK_TAI`.
    Tai,
    /// Another clock (an audio sink's, a network or PTP clock), by its GObject type name.
    Other(String),
}

/// When a frame was captured: its PTS as a time of the pipeline's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureTime {
    /// Running time + base time, in nanoseconds of `clock`.
    pub clock_ns: u64,
    /// The pipeline's clock.
    pub clock: ClockKind,
}
