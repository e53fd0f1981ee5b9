//! Frames from a GStreamer pipeline, without ROS: a user's launch description (the source
//! part of a `gst-launch-1.0` line) ended by our appsink, whose caps are exactly the
//! formats the kernels decode ([`ACCEPTED`]), and each buffer lent as an [`ImageView`]
//! (feature `gstreamer`).
//!
//! ```text
//! "<description> ! appsink name=vision_preproc_sink"   (caps: ACCEPTED, max-buffers 2, sync=false;
//!                                                        drop=true for a live source)
//!     CaptureSource::start(description)   parse, PLAYING, wait for the state change
//!     source.next(timeout)                Ok(Some(Frame)) | Ok(None) on timeout | Err(named fault)
//!     frame.view()                        an ImageView of the mapped buffer (or of one tight copy)
//!     source.stop() / drop                NULL: the streaming threads joined, the device closed
//! ```
//!
//! **Layout.** An `ImageView` has one `step` for every row and, for NV12/NV21, the chroma
//! plane right after `height` rows of `step` bytes. GStreamer's default layouts (what a
//! source writes when the sink does not take `GstVideoMeta`, which appsink does not) are
//! exactly that, with every row padded to a multiple of 4 bytes (`RGB` at width 321: step
//! 964, not 963; NV12 at width 322: step 324 for both planes, chroma at `324 * height`):
//! such a frame is borrowed from the mapped buffer, zero copies. A buffer whose
//! `GstVideoMeta` says otherwise (planes with different strides, a chroma plane elsewhere, a
//! buffer shorter than its rows) is copied once into tight rows, and [`Frame::copied`] says
//! so. Bayer (`video/x-bayer`) has no `GstVideoInfo`: its step is the buffer's size over
//! its height (`rgb2bayer` pads rows to 4 bytes too).
//!
//! **Capture time.** A frame's [`CaptureTime`] is its PTS as a time of the pipeline's clock
//! (running time + base time) and which clock that is ([`ClockKind`]: GStreamer's system
//! clock is `CLOCK_MONOTONIC` by default). For a live source (`v4l2src`, `is-live=true`)
//! that is when the frame was captured; for a source that is not live it is only the
//! stream's own timeline from the start (frames come as fast as they are made).

mod layout;

use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer::glib::translate::IntoGlib;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;

use crate::error::{CaptureError, Error, Result};
use crate::image::{Encoding, ImageView, Lent, LentMemory, LentReads};
use std::sync::{Arc, OnceLock};

use layout::{Plan, Planes};

/// The formats our appsink accepts, in order of preference: (media type, GStreamer
/// `format`, our encoding, big-endian samples). One source for the appsink's caps, the
/// mapping of a negotiated format to an [`Encoding`] and the error messages.
pub const ACCEPTED: [(&str, &str, Encoding, bool); 17] = [
    ("video/x-raw", "BGR", Encoding::Bgr8, false),
    ("video/x-raw", "RGB", Encoding::Rgb8, false),
    // The fourth byte is ignored by the kernels: padding (x) and alpha alike.
    ("video/x-raw", "BGRx", Encoding::Bgra8, false),
    ("video/x-raw", "BGRA", Encoding::Bgra8, false),
    ("video/x-raw", "RGBx", Encoding::Rgba8, false),
    ("video/x-raw", "RGBA", Encoding::Rgba8, false),
    ("video/x-raw", "GRAY8", Encoding::Mono8, false),
    ("video/x-raw", "GRAY16_LE", Encoding::Mono16, false),
    ("video/x-raw", "GRAY16_BE", Encoding::Mono16, true),
    ("video/x-raw", "YUY2", Encoding::Yuyv, false),
    ("video/x-raw", "UYVY", Encoding::Uyvy, false),
    ("video/x-raw", "NV12", Encoding::Nv12, false),
    ("video/x-raw", "NV21", Encoding::Nv21, false),
    ("video/x-bayer", "rggb", Encoding::BayerRggb8, false),
    ("video/x-bayer", "bggr", Encoding::BayerBggr8, false),
    ("video/x-bayer", "gbrg", Encoding::BayerGbrg8, false),
    ("video/x-bayer", "grbg", Encoding::BayerGrbg8, false),
];

/// The name of our appsink in the pipeline.
const SINK_NAME: &str = "vision_preproc_sink";
/// Buffers the appsink keeps for a caller that is late. A live source's older ones are
/// dropped (the newest frame wins, as in the node's keep-latest slot); a source that is not
/// live (a file) waits for the caller instead: every frame is delivered.
const SINK_MAX_BUFFERS: u32 = 2;
/// How long [`CaptureSource::start`] waits for the pipeline to reach PLAYING (a source
/// that is still prerolling after it is not a fault: its errors come from `next`).
const START_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `start` waits for the error message behind a failed state change.
const ERROR_GRACE_MS: u64 = 1000;
/// How long an end of stream waits for an error message behind it.
const ERROR_AFTER_EOS_MS: u64 = 100;
/// How often `next` looks at the bus while no frame arrives: an error or end of stream
/// is reported within this time (a frame is returned as soon as it arrives).
const BUS_POLL: Duration = Duration::from_millis(20);

/// The accepted formats as the error messages list them: `video/x-raw` BGR, RGB, ...;
/// `video/x-bayer` rggb, ...
pub fn accepted_list() -> String {
    let list = |media: &str| {
        ACCEPTED.iter().filter(|a| a.0 == media).map(|a| a.1).collect::<Vec<_>>().join(", ")
    };
    format!("video/x-raw {}; video/x-bayer {} (8-bit)", list("video/x-raw"), list("video/x-bayer"))
}

/// What `vision_preproc info` says of GStreamer: its version and whether `gst:` inputs
/// can run here (GStreamer initializes, our appsink's plugin is installed), or why not.
pub fn status() -> String {
    if let Err(e) = gst::init() {
        return format!("cannot be initialized ({e}): `gst:` inputs cannot run");
    }
    let (major, minor, micro, _) = gst::version();
    let version = format!("{major}.{minor}.{micro}");
    match gst::ElementFactory::find("appsink") {
        Some(_) => format!(
            "{version}: `gst:` inputs run in the node; their frames are read in place from \
             GStreamer's buffers (the CUDA backend's GPU reads a buffer of system memory where \
             it is, registered with the driver: no host copy; any other after one host copy \
             into its pinned staging)"
        ),
        None => format!(
            "{version}, but no appsink (install gstreamer1.0-plugins-base): `gst:` inputs \
             cannot run"
        ),
    }
}

/// The appsink's caps: every entry of [`ACCEPTED`], in system memory.
fn accepted_caps() -> gst::Caps {
    let mut caps = gst::Caps::new_empty();
    for media in ["video/x-raw", "video/x-bayer"] {
        let formats = ACCEPTED.iter().filter(|a| a.0 == media).map(|a| a.1);
        let s = gst::Structure::builder(media).field("format", gst::List::new(formats)).build();
        caps.make_mut().append_structure(s);
    }
    caps
}

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

/// Where a frame's bytes are: the mapped `GstBuffer` (kept mapped and alive until the
/// frame is dropped) or one tight copy of it.
enum Bytes {
    Mapped { buffer: gst::MappedBuffer<gst::buffer::Readable>, start: usize, len: usize },
    Copied(Vec<u8>),
}

/// One frame from a [`CaptureSource`]: it owns its bytes (a mapped GStreamer buffer, or one
/// copy of it) and lends them as an [`ImageView`].
pub struct Frame {
    bytes: Bytes,
    width: u32,
    height: u32,
    step: u32,
    encoding: Encoding,
    big_endian: bool,
    capture_time: Option<CaptureTime>,
    sequence: u64,
    /// The mapped buffer's memory, lent to the backend ([`lend`]).
    lent: Option<Lent>,
}

impl Frame {
    /// A frame over `bytes`, checked once here as an [`ImageView`] (so `view` is).
    fn new(
        bytes: Bytes,
        (width, height, step): (u32, u32, u32),
        (encoding, big_endian): (Encoding, bool),
        capture_time: Option<CaptureTime>,
        sequence: u64,
    ) -> std::result::Result<Frame, CaptureError> {
        let frame = Frame {
            bytes,
            width,
            height,
            step,
            encoding,
            big_endian,
            capture_time,
            sequence,
            lent: None,
        };
        ImageView::with_encoding(width, height, step, encoding, big_endian, frame.data())
            .map_err(|e| CaptureError::Frame { message: e.to_string() })?;
        Ok(frame)
    }

    fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped { buffer, start, len } => &buffer.as_slice()[*start..*start + *len],
            Bytes::Copied(v) => v,
        }
    }

    /// The frame as an image (borrowed from the frame: no copy), with the buffer's memory
    /// lent when it can be: one block of GStreamer's system memory ([`ImageView::lent`]).
    pub fn view(&self) -> ImageView<'_> {
        // The header and these same bytes were validated in `Frame::new`; the bytes are
        // owned and never change.
        let view = ImageView::validated(
            self.width,
            self.height,
            self.step,
            self.encoding,
            self.big_endian,
            self.data(),
        );
        match &self.lent {
            Some(lent) => view.lent_from(lent),
            None => view,
        }
    }

    /// Whether its bytes lie in a GStreamer buffer's memory lent to the backend, which a
    /// GPU backend may then read in place: one block of GStreamer's system memory.
    pub fn is_lent(&self) -> bool {
        self.lent.is_some()
    }

    /// The buffer's capture time, when it has a PTS and the pipeline a clock.
    pub fn capture_time(&self) -> Option<&CaptureTime> {
        self.capture_time.as_ref()
    }
    /// This frame's number among the frames its source delivered (0, 1, ...).
    pub fn sequence(&self) -> u64 {
        self.sequence
    }
    /// True when the buffer's layout differed from an `ImageView`'s and the frame is one
    /// copy of it in tight rows; false when the view reads the mapped buffer in place.
    pub fn copied(&self) -> bool {
        matches!(self.bytes, Bytes::Copied(_))
    }
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("step", &self.step)
            .field("encoding", &self.encoding)
            .field("big_endian", &self.big_endian)
            .field("capture_time", &self.capture_time)
            .field("sequence", &self.sequence)
            .field("copied", &self.copied())
            .finish()
    }
}

/// A running GStreamer pipeline: the user's description ended by our appsink. Stopped (to
/// NULL: threads joined, devices and files closed) by [`CaptureSource::stop`] or on drop.
pub struct CaptureSource {
    description: String,
    pipeline: gst::Pipeline,
    sink: gst_app::AppSink,
    bus: gst::Bus,
    clock: Option<ClockKind>,
    delivered: u64,
    stopped: bool,
    live: bool,
    /// What backends did with this source's lent frames.
    reads: Arc<LentReads>,
}

impl CaptureSource {
    /// Parse `description` (the source part of a `gst-launch-1.0` line, e.g.
    /// `v4l2src device=/dev/video0 ! video/x-raw,format=YUY2`), end it with our appsink
    /// and set it PLAYING. Errors at parse time (syntax, a missing element, a property)
    /// and those posted while it starts (a missing device; caps that cannot be negotiated,
    /// for a source that is not live) are returned here; a live source's negotiation
    /// fails on the first [`CaptureSource::next`].
    pub fn start(description: &str) -> Result<CaptureSource> {
        let fail = |fault| Error::Capture { description: description.to_string(), fault };
        gst::init().map_err(|e| fail(CaptureError::Init(e.to_string())))?;
        let line = format!(
            "{description} ! appsink name={SINK_NAME} max-buffers={SINK_MAX_BUFFERS} drop=false sync=false"
        );
        let mut context = gst::ParseContext::new();
        let element =
            gst::parse::launch_full(&line, Some(&mut context), gst::ParseFlags::FATAL_ERRORS)
                .map_err(|e| fail(parse_fault(&e, &context)))?;
        let pipeline = element.downcast::<gst::Pipeline>().map_err(|_| {
            fail(CaptureError::Link {
                message: "the description is not a chain of elements".into(),
            })
        })?;
        let sink = pipeline
            .by_name(SINK_NAME)
            .and_then(|e| e.downcast::<gst_app::AppSink>().ok())
            .ok_or_else(|| {
                fail(CaptureError::Link {
                    message: format!(
                        "our appsink `{SINK_NAME}` is not in the pipeline (is the name taken?)"
                    ),
                })
            })?;
        sink.set_caps(Some(&accepted_caps()));
        let bus = pipeline.bus().ok_or_else(|| {
            fail(CaptureError::State {
                state: "PLAYING".into(),
                message: "the pipeline has no bus".into(),
            })
        })?;
        let mut source = CaptureSource {
            description: description.to_string(),
            pipeline,
            sink,
            bus,
            clock: None,
            delivered: 0,
            stopped: false,
            live: false,
            reads: Arc::default(),
        };
        let started = source.pipeline.set_state(gst::State::Playing);
        let settled = started
            .and_then(|_| source.pipeline.state(gst::ClockTime::try_from(START_TIMEOUT).ok()).0);
        if let Some(fault) = source.bus_fault(gst::ClockTime::ZERO) {
            return Err(source.fail(fault));
        }
        if let Err(e) = settled {
            // The error message that says why can reach the bus just after the failed
            // state change (from a streaming thread): wait a little for it.
            let fault = source.bus_fault(gst::ClockTime::from_mseconds(ERROR_GRACE_MS));
            return Err(source.fail(fault.unwrap_or_else(|| CaptureError::State {
                state: "PLAYING".into(),
                message: e.to_string(),
            })));
        }
        // Live (a camera, `is-live=true`): keep the newest frames, drop the older ones.
        // Asked upstream of our appsink (a sink that does not sync answers "not live").
        let mut latency = gst::query::Latency::new();
        let upstream = source.sink.static_pad("sink").and_then(|p| p.peer());
        if upstream.is_some_and(|p| p.query(&mut latency)) && latency.result().0 {
            source.live = true;
            source.sink.set_drop(true);
        }
        Ok(source)
    }

    /// Count what backends do with this source's lent frames in `reads` (kept by the
    /// caller across restarts) instead of the source's own counters.
    pub fn count_reads_in(&mut self, reads: Arc<LentReads>) {
        self.reads = reads;
    }

    /// The next frame: `Ok(Some)` as soon as one arrives, `Ok(None)` when none came
    /// within `timeout`, `Err` with the named fault when the pipeline posted an error or
    /// ended (the source is then of no further use: stop it and start a new one).
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Frame>> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = Instant::now();
            let slice = deadline.saturating_duration_since(now).min(BUS_POLL);
            let wait = gst::ClockTime::from_nseconds(slice.as_nanos() as u64);
            if let Some(sample) = self.sink.try_pull_sample(wait) {
                return self.frame(&sample).map(Some).map_err(|f| self.fail(f));
            }
            if let Some(fault) = self.bus_fault(gst::ClockTime::ZERO) {
                return Err(self.fail(self.end_fault(fault)));
            }
            if self.sink.is_eos() {
                let fault =
                    self.bus_fault(gst::ClockTime::ZERO).unwrap_or(CaptureError::EndOfStream);
                return Err(self.fail(self.end_fault(fault)));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// The description as given.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// True for a live source (a camera, `is-live=true`): its capture times are when the
    /// frames were captured. A source that is not live (a file) has stream times instead.
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// Frames delivered so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// The pipeline clock's time now, in nanoseconds (the clock of [`CaptureTime`]), to
    /// relate capture times to another clock; `None` before the pipeline has a clock.
    pub fn clock_now_ns(&self) -> Option<u64> {
        self.pipeline.clock().map(|c| c.time().nseconds())
    }

    /// Set the pipeline to NULL: its streaming threads are joined and its devices and
    /// files closed. Frames still alive keep their own buffers.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.stopped, true) {
            return Ok(());
        }
        self.pipeline.set_state(gst::State::Null).map(|_| ()).map_err(|e| {
            self.fail(CaptureError::State { state: "NULL".into(), message: e.to_string() })
        })
    }

    fn fail(&self, fault: CaptureError) -> Error {
        Error::Capture { description: self.description.clone(), fault }
    }

    /// The first error or end of stream on the bus within `wait` (other messages are
    /// dropped).
    fn bus_fault(&self, wait: gst::ClockTime) -> Option<CaptureError> {
        let message =
            self.bus.timed_pop_filtered(wait, &[gst::MessageType::Error, gst::MessageType::Eos])?;
        Some(match message.view() {
            gst::MessageView::Error(err) => self.error_fault(err),
            _ => CaptureError::EndOfStream,
        })
    }

    /// The cause behind an end of stream: an error that reaches the bus just after it (a
    /// live `videotestsrc` that cannot negotiate ends its stream with no error message
    /// first, seen in 4 of 10 runs), or, before any frame, caps that have nothing in
    /// common with ours.
    fn end_fault(&self, fault: CaptureError) -> CaptureError {
        if fault != CaptureError::EndOfStream {
            return fault;
        }
        let wait = gst::ClockTime::from_mseconds(ERROR_AFTER_EOS_MS);
        if let Some(message) = self.bus.timed_pop_filtered(wait, &[gst::MessageType::Error]) {
            if let gst::MessageView::Error(err) = message.view() {
                return self.error_fault(err);
            }
        }
        let offered = self
            .sink
            .static_pad("sink")
            .and_then(|pad| pad.peer())
            .map(|peer| peer.query_caps(None));
        match offered {
            Some(caps) if self.delivered == 0 && !caps.can_intersect(&accepted_caps()) => {
                CaptureError::NotNegotiated {
                    element: self.pipeline.name().to_string(),
                    offered: caps.to_string(),
                    accepted: accepted_list(),
                }
            }
            _ => fault,
        }
    }

    /// An error message, named by its cause.
    fn error_fault(&self, err: &gst::message::Error) -> CaptureError {
        let element = err.src().map(|s| s.name().to_string()).unwrap_or_else(|| "?".into());
        let error = err.error();
        let debug = err.debug().map(|d| d.to_string()).unwrap_or_default();
        let message =
            if debug.is_empty() { error.to_string() } else { format!("{error} ({debug})") };
        let flow = err.details().and_then(|d| d.get::<i32>("flow-return").ok());
        let not_negotiated = flow == Some(gst::FlowReturn::NotNegotiated.into_glib())
            || debug.contains("not-negotiated");
        if not_negotiated {
            return CaptureError::NotNegotiated {
                element,
                offered: self.offered(),
                accepted: accepted_list(),
            };
        }
        match error.kind::<gst::ResourceError>() {
            Some(
                gst::ResourceError::NotFound
                | gst::ResourceError::OpenRead
                | gst::ResourceError::OpenReadWrite
                | gst::ResourceError::Busy,
            ) => CaptureError::NoDevice { element, message },
            _ => CaptureError::Element { element, message },
        }
    }

    /// What the description's last element can output (its caps), for the message of a
    /// failed negotiation.
    fn offered(&self) -> String {
        let caps = self
            .sink
            .static_pad("sink")
            .and_then(|pad| pad.peer())
            .map(|peer| peer.query_caps(None));
        match caps {
            Some(c) if !c.is_empty() => c.to_string(),
            _ => "no format we know".into(),
        }
    }

    /// A sample as a frame: its format mapped to our encoding, its layout to one step.
    fn frame(&mut self, sample: &gst::Sample) -> std::result::Result<Frame, CaptureError> {
        let bad = |message: String| CaptureError::Frame { message };
        let caps = sample.caps().ok_or_else(|| bad("a sample without caps".into()))?;
        let s = caps.structure(0).ok_or_else(|| bad("empty caps".into()))?;
        let format = s.get::<&str>("format").unwrap_or("");
        let &(_, _, encoding, big_endian) = ACCEPTED
            .iter()
            .find(|a| a.0 == s.name().as_str() && a.1 == format)
            .ok_or_else(|| bad(format!("caps {caps} are none of ours ({})", accepted_list())))?;
        let buffer =
            sample.buffer_owned().ok_or_else(|| bad("a sample without a buffer".into()))?;
        let (width, height, planes) = if s.name() == "video/x-raw" {
            let info = gst_video::VideoInfo::from_caps(caps)
                .map_err(|e| bad(format!("caps {caps}: {e}")))?;
            let planes = match buffer.meta::<gst_video::VideoMeta>() {
                Some(meta) => Planes::new(meta.stride(), meta.offset()),
                None => Planes::new(info.stride(), info.offset()),
            };
            (info.width(), info.height(), planes.map_err(bad)?)
        } else {
            let width = s.get::<i32>("width").map_err(|e| bad(format!("caps {caps}: {e}")))?;
            let height = s.get::<i32>("height").map_err(|e| bad(format!("caps {caps}: {e}")))?;
            let (width, height) = (width.max(0) as u32, height.max(0) as u32);
            (width, height, Planes::bayer(width, height, buffer.size()).map_err(bad)?)
        };
        if matches!(encoding, Encoding::Yuyv | Encoding::Uyvy) && !width.is_multiple_of(2) {
            return Err(bad(format!(
                "{format} at odd width {width}: 4:2:2 pixels come in pairs; set an even width in the description's caps (or `videoscale ! video/x-raw,width=<even>`)"
            )));
        }
        let capture_time = self.capture_time(sample, &buffer);
        let mapped = buffer
            .into_mapped_buffer_readable()
            .map_err(|_| bad("the buffer cannot be mapped for reading".into()))?;
        let plan = layout::plan(encoding, width, height, &planes, mapped.size()).map_err(bad)?;
        let mut lent = None;
        let (bytes, step) = match plan {
            Plan::Borrow { start, len, step } => {
                lent = lend(&mapped, &self.reads);
                (Bytes::Mapped { buffer: mapped, start, len }, step)
            }
            Plan::Copy { step } => (
                Bytes::Copied(layout::copy_tight(
                    encoding,
                    width,
                    height,
                    &planes,
                    mapped.as_slice(),
                )),
                step,
            ),
        };
        let step = u32::try_from(step).map_err(|_| bad(format!("row stride {step} over 4 GiB")))?;
        let frame = Frame::new(
            bytes,
            (width, height, step),
            (encoding, big_endian),
            capture_time,
            self.delivered,
        )?;
        self.delivered += 1;
        Ok(Frame { lent, ..frame })
    }

    /// The buffer's PTS as a time of the pipeline's clock.
    fn capture_time(&mut self, sample: &gst::Sample, buffer: &gst::Buffer) -> Option<CaptureTime> {
        let pts = buffer.pts()?;
        let segment = sample.segment()?.downcast_ref::<gst::ClockTime>()?;
        let running = segment.to_running_time(pts)?;
        let base = self.pipeline.base_time()?;
        if self.clock.is_none() {
            self.clock = self.pipeline.clock().map(|c| clock_kind(&c));
        }
        Some(CaptureTime { clock_ns: (running + base).nseconds(), clock: self.clock.clone()? })
    }
}

impl Drop for CaptureSource {
    fn drop(&mut self) {
        // A failure to reach NULL has no one to report to here; stop() reports it.
        let _ = self.stop_inner();
    }
}

/// Which clock `clock` is.
fn clock_kind(clock: &gst::Clock) -> ClockKind {
    if clock.is::<gst::SystemClock>() {
        match clock.property::<gst::ClockType>("clock-type") {
            gst::ClockType::Monotonic => return ClockKind::Monotonic,
            gst::ClockType::Realtime => return ClockKind::Realtime,
            gst::ClockType::Tai => return ClockKind::Tai,
            _ => {}
        }
    }
    ClockKind::Other(clock.type_().name().to_string())
}

/// A parse error by its kind, the missing elements named with their Debian package.
fn parse_fault(e: &gst::glib::Error, context: &gst::ParseContext) -> CaptureError {
    let message = e.message().to_string();
    match e.kind::<gst::ParseError>() {
        Some(gst::ParseError::NoSuchElement) => {
            let element = context.missing_elements().into_iter().next().unwrap_or_else(|| {
                // "no element \"x\"": the name between the quotes.
                message.split('"').nth(1).unwrap_or(&message).to_string()
            });
            let package = debian_package(&element).to_string();
            CaptureError::NoSuchElement { element, package }
        }
        Some(gst::ParseError::NoSuchProperty | gst::ParseError::CouldNotSetProperty) => {
            CaptureError::Property { message }
        }
        Some(gst::ParseError::Link | gst::ParseError::DelayedLink) => {
            CaptureError::Link { message }
        }
        _ => CaptureError::Syntax { message },
    }
}

/// The Debian 12 package of a GStreamer element, for the message of a missing one.
fn debian_package(element: &str) -> &'static str {
    const PACKAGES: [(&str, &[&str]); 6] = [
        (
            "gstreamer1.0-plugins-base",
            &[
                "videotestsrc",
                "videoconvert",
                "videoscale",
                "videorate",
                "appsrc",
                "appsink",
                "playbin",
                "uridecodebin",
                "decodebin",
                "tcpclientsrc",
                "oggdemux",
                "theoradec",
            ],
        ),
        (
            "gstreamer1.0-plugins-good",
            &[
                "v4l2src",
                "pngdec",
                "jpegdec",
                "multifilesrc",
                "rtspsrc",
                "rtpjpegdepay",
                "rtph264depay",
                "udpsrc",
                "souphttpsrc",
                "qtdemux",
                "matroskademux",
                "avimux",
                "videocrop",
                "videoflip",
                "imagefreeze",
            ],
        ),
        (
            "gstreamer1.0-plugins-bad",
            &[
                "rgb2bayer",
                "bayer2rgb",
                "h264parse",
                "h265parse",
                "srtsrc",
                "webrtcbin",
                "nvh264dec",
                "kmssink",
            ],
        ),
        ("gstreamer1.0-plugins-ugly", &["x264enc", "mpeg2dec"]),
        ("gstreamer1.0-libav", &["avdec_h264", "avdec_h265", "avdec_mjpeg"]),
        (
            "JetPack's nvidia-l4t-gstreamer",
            &["nvarguscamerasrc", "nvvidconv", "nvv4l2decoder", "nvjpegdec"],
        ),
    ];
    PACKAGES
        .iter()
        .find(|(_, elements)| elements.contains(&element))
        .map(|(package, _)| *package)
        .unwrap_or("one of gstreamer1.0-plugins-base, -good, -bad, -ugly or gstreamer1.0-libav")
}

/// A mapped buffer's memory lent to the backend ([`Lent`]): one block of GStreamer's
/// system memory (not a sub-memory of another, not a device's mapping such as V4L2's or a
/// DMA-buf), whose identity is kept on the memory itself ([`lent_memory`]). `None` for
/// anything else: the backend then copies the frame once, as it copies a topic's.
fn lend(mapped: &gst::MappedBuffer<gst::buffer::Readable>, reads: &Arc<LentReads>) -> Option<Lent> {
    let buffer = mapped.buffer();
    if buffer.n_memory() != 1 {
        return None;
    }
    let memory = buffer.peek_memory(0);
    let sysmem =
        std::str::from_utf8(gst::ffi::GST_ALLOCATOR_SYSMEM).ok().map(|t| t.trim_end_matches('\0'));
    if memory.parent().is_some() || !sysmem.is_some_and(|t| memory.is_type(t)) {
        return None;
    }
    // The mapping of the buffer's one memory starts `offset` bytes into its block of
    // `maxsize` bytes (system memory maps its block in place).
    let base = mapped.as_slice().as_ptr().wrapping_sub(memory.offset());
    let identity = lent_memory(memory);
    // SAFETY: system memory's block of `maxsize` bytes at `base` stays allocated until the
    // memory is finalized, which first calls `lent_memory`'s destroy notify (it says
    // freed); the frame keeps the buffer mapped (readable: nobody writes it) for as long
    // as it lives, and the pipeline keeps a set's frames until the set is finished.
    Some(unsafe { Lent::new(base, memory.maxsize(), identity, reads.clone()) })
}

/// The quark under which a memory keeps its [`LentMemory`].
fn lent_quark() -> gst::glib::ffi::GQuark {
    static QUARK: OnceLock<gst::glib::ffi::GQuark> = OnceLock::new();
    *QUARK.get_or_init(|| gst::glib::Quark::from_str("vision-preproc-lent-memory").into_glib())
}

/// The identity of `memory` as a [`LentMemory`]: kept as the memory's qdata, made the
/// first time a frame lies in it; the qdata's destroy notify (called when the memory is
/// finalized, before its block is freed) says it was freed.
fn lent_memory(memory: &gst::MemoryRef) -> Arc<LentMemory> {
    let object = memory.as_ptr() as *mut gst::ffi::GstMiniObject;
    // SAFETY: `memory` is alive (the caller's mapped buffer holds it); the qdata under our
    // quark is only ever an `Arc<LentMemory>` turned into a raw pointer here, owned by the
    // memory (one strong count) until `memory_freed` takes it back.
    unsafe {
        let kept = gst::ffi::gst_mini_object_get_qdata(object, lent_quark()) as *const LentMemory;
        if !kept.is_null() {
            Arc::increment_strong_count(kept);
            return Arc::from_raw(kept);
        }
        let identity = Arc::new(LentMemory::default());
        let owned = Arc::into_raw(identity.clone());
        gst::ffi::gst_mini_object_set_qdata(
            object,
            lent_quark(),
            owned as *mut std::ffi::c_void,
            Some(memory_freed),
        );
        identity
    }
}

/// The destroy notify of a memory's [`LentMemory`]: it was freed.
unsafe extern "C" fn memory_freed(data: gst::glib::ffi::gpointer) {
    // SAFETY: `data` is the pointer `lent_memory` made with `Arc::into_raw`, whose count
    // the memory owned; called once, when the memory is finalized.
    let identity = unsafe { Arc::from_raw(data as *const LentMemory) };
    identity.free();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_formats_map_to_distinct_caps_and_cover_the_8_bit_encodings_but_16_bit_rgb() {
        let mut seen = std::collections::HashSet::new();
        for (media, format, _, _) in ACCEPTED {
            assert!(seen.insert((media, format)), "{media} {format} twice");
        }
        for e in Encoding::ALL {
            let covered = ACCEPTED.iter().any(|a| a.2 == e);
            // GStreamer has no 16-bit RGB format of 3 samples (its RGB16 is 5-6-5).
            assert_eq!(covered, !matches!(e, Encoding::Rgb16 | Encoding::Bgr16), "{e}");
        }
        assert_eq!(
            accepted_list(),
            "video/x-raw BGR, RGB, BGRx, BGRA, RGBx, RGBA, GRAY8, GRAY16_LE, GRAY16_BE, YUY2, UYVY, NV12, NV21; video/x-bayer rggb, bggr, gbrg, grbg (8-bit)"
        );
    }

    #[test]
    fn missing_elements_name_their_debian_package() {
        assert_eq!(debian_package("rgb2bayer"), "gstreamer1.0-plugins-bad");
        assert_eq!(debian_package("v4l2src"), "gstreamer1.0-plugins-good");
        assert!(debian_package("nosuchelement").starts_with("one of"));
    }

    #[test]
    fn a_memory_says_when_it_is_freed() {
        gst::init().unwrap();
        let mem = gst::Memory::with_size(1000);
        let id = lent_memory(&mem);
        let again = lent_memory(&mem);
        assert!(Arc::ptr_eq(&id, &again));
        assert!(!id.freed());
        drop(mem);
        assert!(id.freed());
    }
}
