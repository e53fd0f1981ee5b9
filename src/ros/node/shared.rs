//! The state the node's threads share: the received frames and formed sets, the
//! counters, each input's and camera's state, the parameters, the clock and the backend
//! as `/diagnostics` shows it; the output publishers; the rate-limited error log. The
//! types of that state live here, not with the code that fills them (the former, the
//! input), which imports this module: nothing here imports them back.

use super::clock::{self, NodeClock};
use super::native::{NativeCompressed, NativeImage};
use super::params::NodeParams;
use super::stats::{BackendInfo, Stats};
use crate::compressed::{Compressed, Limits};
use crate::image::LentReads;
use crate::pipeline::FrameView;
use crate::transport::batch_sync::{Batch, CameraCounts, Item};
use crate::transport::{DeliveryMonitor, Latest};
use crate::wire::msgs::Header;
use r2r::sensor_msgs::msg::{CameraInfo, Image};
use r2r::QosProfile;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A frame set handed to the processing thread, with the instant it was formed (the
/// arrival of the frame that completed it, or the deadline's poll).
pub(super) struct Formed {
    /// One item per input.
    pub batch: Batch<Received>,
    /// When it was formed.
    pub at: Instant,
}

impl Formed {
    /// Frames of the batch not in an earlier one.
    pub(super) fn new_frames(&self) -> u64 {
        self.batch.items.iter().filter(|i| matches!(i, Item::Frame { repeated: false, .. })).count()
            as u64
    }
}

/// What `/diagnostics` shows of one camera (written by the spin thread and, for
/// `published`, the processing thread).
#[derive(Debug, Clone, Default)]
pub(super) struct CameraState {
    /// The image topic, resolved.
    pub topic: String,
    /// The former's counters (received = batched + dropped + pending).
    pub counts: CameraCounts,
    /// No frame for `stale_after_ms`.
    pub stale: bool,
    /// When its last frame arrived.
    pub last_arrival: Option<Instant>,
    /// Its frames in published sets (once each).
    pub published: u64,
    /// Its frames rejected as invalid.
    pub rejected: u64,
}

/// What `/diagnostics` says about the input (written by the spin thread, read by the
/// diagnostics task).
#[derive(Debug, Default)]
pub(super) struct InputState {
    /// The image topic, fully qualified (after remapping; a compressed input's
    /// `<topic>/compressed`).
    pub topic: String,
    /// A topic input's transport (`raw`, `compressed`).
    pub transport: Option<crate::config::Transport>,
    /// The subscription's QoS and why it was chosen.
    pub qos: String,
    /// Image publishers matched in the graph.
    pub publishers: usize,
    /// The subscription is best effort (lost fragments of large frames are not
    /// repaired).
    pub best_effort: bool,
    /// Arrivals, for frames lost before the node.
    pub monitor: DeliveryMonitor,
    /// A pipeline input's state (`None` for a topic).
    pub pipeline: Option<PipelineState>,
    /// A video input's feed (transports `foxglove`, `ffmpeg`, `compressed`), for its
    /// counts.
    pub video: Option<Arc<crate::capture::VideoFeed>>,
}

/// What `/diagnostics` says about a pipeline input (written by its capture thread).
#[derive(Debug, Default)]
pub(super) struct PipelineState {
    /// Running and delivering (false while it waits to be restarted).
    pub running: bool,
    /// A live source (a camera): stamps are capture times.
    pub live: bool,
    /// Faults at run time (error messages, end of stream, no frame), each followed by a
    /// restart.
    pub faults: u64,
    /// Restarts that brought the pipeline back.
    pub restarts: u64,
    /// The last fault and when it happened.
    pub last_fault: Option<(String, Instant)>,
    /// Frames read in place from GStreamer's buffer.
    pub in_place: u64,
    /// Frames copied once into tight rows first (their buffer's layout differed).
    pub copied: u64,
    /// Frames read in place from a buffer whose memory cannot be lent to the backend
    /// (not one block of system memory: `capture::Frame::is_lent`).
    pub not_lent: u64,
    /// What the backend did with the frames in GStreamer's memory (read in place, or
    /// copied once into its staging), kept across restarts.
    pub reads: Arc<LentReads>,
    /// Frames published on `<camera>/image_raw` (only while someone subscribes).
    pub raw_published: u64,
}

/// How a pipeline frame's bytes reach the kernels of `backend`, as the start-up log says
/// it.
// Used by the GStreamer capture only (src/capture/, src/ros/node/camera.rs).
#[cfg_attr(not(feature = "gstreamer"), allow(dead_code))]
pub(super) fn pipeline_copies(backend: &str) -> &'static str {
    if backend == "cuda" {
        "read in place from GStreamer's buffers; the GPU reads a buffer of CUDA memory (a \
         hardware decoder's) on the device (no upload, no host copy) and a buffer of system \
         memory where it is (registered with the driver once: no host copy), any other once \
         copied into the pinned (integrated GPU: mapped) staging buffer"
    } else {
        "read in place from GStreamer's buffers by the CPU backend: no copy"
    }
}

impl PipelineState {
    /// The host copies of this input's frames, as `/diagnostics` says them (the ledger).
    pub(super) fn copies(&self, backend: &str) -> String {
        let layout = format!("{} first copied once into tight rows (their layout)", self.copied);
        let frames = self.in_place + self.copied;
        if backend != "cuda" {
            return format!(
                "{frames} frames read from GStreamer's buffers by the CPU backend, no other \
                 copy; {layout}"
            );
        }
        let in_place = self.reads.in_place.load(Ordering::Relaxed);
        let on_device = self.reads.on_device.load(Ordering::Relaxed);
        let staged = self.reads.staged.load(Ordering::Relaxed);
        let by: Vec<String> =
            lock(&self.reads.staged_by).iter().map(|(k, n)| format!("{k} {n}")).collect();
        let why = lock(&self.reads.why_staged)
            .as_ref()
            .map(|w| format!(" (by reason: {}; the last: {w})", by.join(", ")));
        format!(
            "{frames} frames from GStreamer's buffers: the GPU read {on_device} in CUDA memory \
             on the device (no upload, no host copy), {in_place} in place in system memory \
             (registered: no host copy) and {staged} after one host copy into its pinned \
             staging buffer{}; {} not lendable (not one block of system memory: one host \
             copy each); {layout}; frames replaced in the keep-latest slot are in none",
            why.unwrap_or_default(),
            self.not_lent
        )
    }
}

/// Seconds between two logs of rejected frames (the count in between is logged).
const REJECT_LOG_PERIOD: Duration = Duration::from_secs(2);

/// A mutex's value, also after a thread panicked holding it.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A frame as received, with what the node reads of it once, when it arrives: its
/// header, stamp and encoding.
pub(super) struct Received {
    /// Its pixels, read in place.
    pub image: Pixels,
    /// Its header (stamp, frame_id).
    pub header: Header,
    /// The header stamp in ns since the epoch.
    pub stamp_ns: i64,
    /// The encoding as it arrived: `sensor_msgs/Image`'s, or a compressed image's
    /// `format` (published in a `TensorBatch` item's `source_encoding`).
    pub encoding: String,
    /// When the node took it (from the subscription, or from the pipeline's sink).
    pub at: Instant,
}

impl Received {
    /// `image` as it arrived at `at`, its header, stamp and encoding read.
    pub(super) fn new(image: Pixels, at: Instant) -> Self {
        let (header, encoding) = match &image {
            Pixels::Message(m) => (m.header(), m.encoding().to_string()),
            Pixels::Compressed(m) => (m.header(), m.format().to_string()),
            Pixels::Captured(c) => (c.header.clone(), c.frame.encoding().name().to_string()),
        };
        let stamp_ns = header.stamp_ns();
        Received { image, header, stamp_ns, encoding, at }
    }
}

/// Where a received frame's bytes are: the C message rmw deserialized into (raw or
/// compressed), or the mapped buffer of a pipeline input. All are read in place.
pub(super) enum Pixels {
    /// From an image topic.
    Message(NativeImage),
    /// From a compressed image topic (`<topic>/compressed`): decoded by the backend.
    Compressed(NativeCompressed),
    /// From a GStreamer pipeline inside the node (never without the `gstreamer` feature:
    /// `capture_stub.rs`).
    Captured(Captured),
}

/// A frame of a pipeline input: GStreamer's mapped buffer (shared with the raw image's
/// publication while someone subscribes) and the header the node gave it.
pub(super) struct Captured {
    /// The frame as the sink gave it.
    pub frame: Arc<crate::capture::Frame>,
    /// Its stamp (capture time on the node's clock) and the input's `frame_id`.
    pub header: Header,
}

/// Why a received frame is refused before processing.
#[derive(Debug)]
pub(super) enum Invalid {
    /// A raw image whose header does not fit its data or whose encoding is unknown.
    Image(crate::ImageError),
    /// A compressed image that cannot be decoded (read from its headers).
    Decode(crate::compressed::DecodeError),
}

impl Invalid {
    /// How the log line names the refusal.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Invalid::Image(_) => "invalid image: ",
            Invalid::Decode(_) => "undecodable compressed image: ",
        }
    }
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Invalid::Image(e) => e.fmt(f),
            Invalid::Decode(e) => e.fmt(f),
        }
    }
}

impl Pixels {
    /// The frame, checked (a raw image's header against its data; a compressed one's
    /// headers read, its size against the decode limits), borrowing the bytes.
    pub(super) fn view(&self) -> Result<FrameView<'_>, Invalid> {
        match self {
            Pixels::Message(m) => m.view().map(FrameView::Pixels).map_err(Invalid::Image),
            Pixels::Compressed(m) => Compressed::probe(m.format(), m.data(), &Limits::default())
                .map(FrameView::Compressed)
                .map_err(Invalid::Decode),
            Pixels::Captured(c) => Ok(match (c.frame.view(), c.frame.device()) {
                (Some(v), _) => FrameView::Pixels(v),
                (None, Some(d)) => FrameView::Device(d),
                // A frame is one or the other (`capture::Frame`).
                (None, None) => {
                    return Err(Invalid::Image(crate::ImageError::ZeroSize {
                        width: c.frame.width(),
                        height: c.frame.height(),
                    }))
                }
            }),
        }
    }
}

/// The QoS of the outputs.
pub(super) fn output_qos(profile: crate::config::QosPreset, depth: u32) -> QosProfile {
    use crate::config::QosPreset as P;
    let base = match profile {
        P::SensorData => QosProfile::sensor_data(),
        // `auto` is refused for the outputs by `Config::validate`.
        P::Default | P::Auto => QosProfile::default(),
        P::SystemDefault => QosProfile::system_default(),
    };
    base.keep_last(depth as usize)
}

/// The publishers of the publishing thread. `tensor` and `timing` publish the serialized
/// messages the pipeline and `frame_timing` write (`publish_raw`).
#[derive(Clone)]
pub(super) struct Outputs {
    /// `tensor`: a `Tensor` with one input, a `TensorBatch` with 2+.
    pub tensor: r2r::PublisherUntyped,
    /// `timing`: one `FrameTiming` per tensor.
    pub timing: r2r::PublisherUntyped,
    /// Per input, the scaled camera_info: `tensor/camera_info` with one input,
    /// `tensor/camera_info_<i>` for batch item i with 2+.
    pub camera_info: Vec<r2r::Publisher<CameraInfo>>,
    /// `debug_image`: what the network sees.
    pub debug_image: r2r::Publisher<Image>,
    /// `tensor_ref`: the `TensorRef` of each set written into a shared block.
    pub tensor_ref: r2r::PublisherUntyped,
}

impl Outputs {
    /// The publishers of a node with `inputs` inputs.
    pub(super) fn create(
        node: &mut r2r::Node,
        inputs: usize,
        qos: &QosProfile,
    ) -> r2r::Result<Self> {
        let batch = inputs >= 2;
        let camera_info = if batch {
            (0..inputs)
                .map(|i| node.create_publisher(&format!("tensor/camera_info_{i}"), qos.clone()))
                .collect::<r2r::Result<Vec<_>>>()?
        } else {
            vec![node.create_publisher("tensor/camera_info", qos.clone())?]
        };
        Ok(Outputs {
            tensor: node.create_publisher_untyped(
                "tensor",
                crate::wire::msgs::tensor_type(batch),
                qos.clone(),
            )?,
            timing: node.create_publisher_untyped(
                "timing",
                crate::wire::msgs::FRAME_TIMING_TYPE,
                qos.clone(),
            )?,
            camera_info,
            debug_image: node.create_publisher("debug_image", qos.clone())?,
            tensor_ref: node.create_publisher_untyped(
                "tensor_ref",
                crate::wire::msgs::TENSOR_REF_TYPE,
                qos.clone(),
            )?,
        })
    }
}

impl Outputs {
    /// Destroy the publishers on `node` (the managed node's cleanup: r2r keeps a
    /// publisher, advertised, until its node destroys it).
    pub(super) fn destroy(self, node: &mut r2r::Node) {
        node.destroy_publisher_untyped(self.tensor);
        node.destroy_publisher_untyped(self.timing);
        for p in self.camera_info {
            node.destroy_publisher(p);
        }
        node.destroy_publisher(self.debug_image);
        node.destroy_publisher_untyped(self.tensor_ref);
    }
}

/// State shared between the spin thread, the processing and publishing threads and the
/// tasks (parameter services, diagnostics).
pub(super) struct Shared {
    /// The keep-latest slot of formed frame sets (one frame each for a single camera).
    pub sets: Latest<Formed>,
    /// The node's counters.
    pub stats: Stats,
    /// Each input as the spin thread sees it (topic, QoS, publishers, arrivals).
    pub inputs: Vec<Mutex<InputState>>,
    /// Each camera's counters and staleness.
    pub cameras: Mutex<Vec<CameraState>>,
    /// Tensors (batches with 2+ inputs) published.
    pub sets_published: AtomicU64,
    /// The parameters as set (the processing thread applies a new generation).
    pub params: Arc<Mutex<NodeParams>>,
    /// The newest camera_info of each input (a pipeline input's from its calibration).
    pub camera_infos: Vec<Mutex<Option<CameraInfo>>>,
    /// The node's logger name.
    pub logger: String,
    /// The node's clock (ROS time; `/clock` with `use_sim_time`).
    pub clock: NodeClock,
    /// What diagnostics say about the backend (changes when `gpu_failure_policy` acts).
    pub backend: Mutex<BackendInfo>,
    /// Set by the processing thread when the node must exit with an error
    /// (`gpu_failure_policy: exit`), with `fatal_signal` notified.
    pub fatal: Mutex<Option<String>>,
    /// Notified with `fatal`.
    pub fatal_signal: tokio::sync::Notify,
    /// The pool of shared output blocks (`tensor_ref`), while there is one.
    pub pool: Mutex<Option<Arc<crate::handoff::Pool>>>,
    /// The output topics' rates and delay in greenwave_monitor's keys (0: `tensor`, 1:
    /// `tensor_ref`).
    pub greenwave: super::greenwave::Greenwave,
    /// Frames are taken (always for the plain node; the managed node only while active):
    /// while false, the former ignores frames (counted neither received nor dropped).
    pub active: AtomicBool,
    /// The managed node's lifecycle state (`lifecycle_msgs/State` id), which
    /// `/diagnostics` says; `None` for the plain node.
    pub lifecycle: Option<Arc<AtomicU8>>,
}

impl Shared {
    /// The state of a node with the given input topics.
    pub(super) fn new(
        inputs: usize,
        params: Arc<Mutex<NodeParams>>,
        logger: String,
        clock: NodeClock,
        (backend, outputs): (BackendInfo, &[String]),
    ) -> Self {
        Shared {
            sets: Latest::default(),
            stats: Stats::default(),
            inputs: (0..inputs).map(|_| Mutex::new(InputState::default())).collect(),
            cameras: Mutex::new(vec![CameraState::default(); inputs]),
            sets_published: AtomicU64::new(0),
            params,
            camera_infos: (0..inputs).map(|_| Mutex::new(None)).collect(),
            logger,
            clock,
            backend: Mutex::new(backend),
            fatal: Mutex::new(None),
            fatal_signal: tokio::sync::Notify::new(),
            pool: Mutex::new(None),
            greenwave: super::greenwave::Greenwave::new(outputs),
            active: AtomicBool::new(true),
            lifecycle: None,
        }
    }

    /// True while frames are taken (see [`Shared::active`]).
    pub(super) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Stop ingest and processing; a set still waiting counts its new frames as dropped.
    pub(super) fn stop(&self) {
        if let Some(set) = self.sets.stop_and_take() {
            self.stats.dropped.fetch_add(set.new_frames(), Ordering::Relaxed);
        }
    }

    /// True once [`Shared::stop`] was called.
    pub(super) fn is_stopped(&self) -> bool {
        self.sets.is_stopped()
    }

    /// `gpu_failure_policy: exit` after a GPU failure, or another error the node cannot
    /// go on after (`reason`): log it, count the `frames` it took as failed, and stop the
    /// node with the reason. The caller's processing loop then ends.
    pub(super) fn exit_fatal(&self, reason: String, frames: u64) {
        if self.lifecycle.is_some() {
            r2r::log_error!(
                self.logger.as_str(),
                "{reason}; the node goes through ErrorProcessing"
            );
        } else {
            r2r::log_fatal!(self.logger.as_str(), "{reason}; the node exits");
        }
        for _ in 0..frames {
            self.stats.failed(reason.clone());
        }
        *lock(&self.fatal) = Some(reason);
        self.stop();
        self.fatal_signal.notify_one();
    }
}

/// Logs errors at most once per [`REJECT_LOG_PERIOD`] of the node's clock, with the count
/// between.
pub(super) struct RateLimitedLog {
    throttle: clock::Throttle,
    clock: NodeClock,
    suppressed: u64,
}

impl RateLimitedLog {
    /// One log line per [`REJECT_LOG_PERIOD`] of the node's clock.
    pub(super) fn new(clock: &NodeClock) -> Self {
        RateLimitedLog {
            throttle: clock::Throttle::new(REJECT_LOG_PERIOD),
            clock: clock.clone(),
            suppressed: 0,
        }
    }

    /// `what` with the count of lines suppressed since the last one, or `None` when one
    /// was logged less than a period ago.
    fn due(&mut self, what: &str) -> Option<String> {
        if !self.throttle.ready(self.clock.now()) {
            self.suppressed += 1;
            return None;
        }
        let line = match std::mem::take(&mut self.suppressed) {
            0 => what.to_string(),
            n => format!("{what} (and {n} more since the last message)"),
        };
        Some(line)
    }

    /// Log `what` as an error, unless one was logged less than a period ago.
    pub(super) fn error(&mut self, logger: &str, what: &str) {
        if let Some(line) = self.due(what) {
            r2r::log_error!(logger, "{line}");
        }
    }

    /// Log `what` as information, unless one was logged less than a period ago.
    pub(super) fn info(&mut self, logger: &str, what: &str) {
        if let Some(line) = self.due(what) {
            r2r::log_info!(logger, "{line}");
        }
    }

    /// Log `what` as a warning, unless one was logged less than a period ago.
    pub(super) fn warn(&mut self, logger: &str, what: &str) {
        if let Some(line) = self.due(what) {
            r2r::log_warn!(logger, "{line}");
        }
    }
}
