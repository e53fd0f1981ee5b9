//! Pipeline inputs: an entry `gst:<launch description>` of `inputs` is a camera inside
//! the node (docs/CAMERAS.md). Its pipeline ([`crate::capture::CaptureSource`]) is
//! started before the node spins (a fault there stops the node with the cause); a
//! thread per pipeline then takes each frame from the sink and pushes it into the same
//! frame-set former as the topics' frames, with the header a camera driver would give it:
//! the stamp is the capture time on the node's clock, `frame_id` the input's.
//!
//! Like a driver it publishes `<camera>/camera_info` (from `camera_info_urls`) with
//! every frame, and the frame itself on `<camera>/image_raw` only while someone
//! subscribes (a copy, made after the frame went to the former). At run time an error,
//! the end of the stream or a pipeline that stops delivering is counted, shown in
//! `/diagnostics` and the pipeline restarted, with a backoff from [`BACKOFF_MIN`] to
//! [`BACKOFF_MAX`].

use super::calibration::read_calibration;
use super::former::Former;
use super::shared::{
    lock, pipeline_copies, Captured, PipelineState, Pixels, RateLimitedLog, Received, Shared,
};
use crate::capture::{CaptureSource, Frame, GpuShare};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::image::LentReads;
use crate::wire::msgs::Header;
use r2r::sensor_msgs::msg::{CameraInfo, Image};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// First wait before a failed pipeline is started again; doubled after each failed
/// start, up to [`BACKOFF_MAX`]; back to this after a frame.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between restarts.
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A running pipeline that delivers no frame for this long (or `stale_after_ms` when
/// that is longer) is restarted.
pub(super) const STALL_MIN: Duration = Duration::from_secs(5);
/// How long start-up waits for a pipeline's first frame (a live source's caps are
/// negotiated with it).
const FIRST_FRAME_WAIT: Duration = Duration::from_secs(2);
/// How long the capture thread waits for a frame before it looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// How often a paused pipeline's thread looks whether the managed node is active again.
const PAUSE_POLL: Duration = Duration::from_millis(10);
/// A capture time older than this is not believed (a clock that is not the capture's):
/// the frame is stamped with its arrival.
const LARGEST_AGE: Duration = Duration::from_secs(1);

/// One pipeline input, as the node was configured.
pub(super) struct PipelineInput {
    /// Batch slot.
    pub index: usize,
    /// The launch description (after `gst:`).
    pub description: String,
    /// `header.frame_id` of its frames.
    pub frame_id: String,
    /// Its camera name: topics `<name>/image_raw` and `<name>/camera_info`.
    pub name: String,
    /// Its calibration, when `camera_info_urls` gives one.
    pub calibration: Option<CameraInfo>,
}

impl PipelineInput {
    /// The pipeline inputs of `config`, with their calibrations read (a file that cannot
    /// be read or parsed is an error naming `camera_info_urls` and the fix).
    pub(super) fn of(config: &Config) -> Result<Vec<PipelineInput>> {
        let mut out = Vec::new();
        for (index, source) in config.input_sources().into_iter().enumerate() {
            let crate::config::InputSource::Pipeline(description) = source else { continue };
            let calibration = match config.camera_info_urls.get(index).filter(|u| !u.is_empty()) {
                Some(url) => Some(read_calibration(url).map_err(|e| {
                    Error::config("camera_info_urls", format!("{url:?} (item {index})"), e)
                })?),
                None => None,
            };
            out.push(PipelineInput {
                index,
                description,
                frame_id: config.pipeline_frame_id(index),
                name: config.pipeline_camera_name(index),
                calibration,
            });
        }
        Ok(out)
    }
}

/// A pipeline input's publishers (made on the node before it spins).
#[derive(Clone)]
pub(super) struct CameraPublishers {
    image: r2r::Publisher<Image>,
    info: r2r::Publisher<CameraInfo>,
}

impl CameraPublishers {
    /// `<name>/image_raw` and `<name>/camera_info` on `node` (relative: namespaces and
    /// remaps apply), sensor-data QoS as camera drivers publish.
    pub(super) fn create(node: &mut r2r::Node, name: &str) -> r2r::Result<Self> {
        let qos = r2r::QosProfile::sensor_data();
        Ok(CameraPublishers {
            image: node.create_publisher(&format!("{name}/image_raw"), qos.clone())?,
            info: node.create_publisher(&format!("{name}/camera_info"), qos)?,
        })
    }

    /// Destroy them on `node` (the managed node's cleanup).
    pub(super) fn destroy(self, node: &mut r2r::Node) {
        node.destroy_publisher(self.image);
        node.destroy_publisher(self.info);
    }
}

/// The running pipeline inputs: one capture thread each. Dropping it stops them (the
/// pipelines go to NULL, the threads are joined).
pub(super) struct Cameras {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// A pipeline input, started: its source and what its thread needs.
pub(super) struct Started {
    input: PipelineInput,
    source: CaptureSource,
    publishers: CameraPublishers,
    /// Its first frame, taken while starting.
    first: Option<Frame>,
    /// What the backend does with its frames (the source counts there).
    reads: Arc<LentReads>,
    /// The backend's CUDA context shared with the pipeline (restarts share it too).
    gpu: Option<Arc<GpuShare>>,
}

/// Start the pipeline of `input` (a fault names the input, its element and the fix) and
/// say on the log what it is and how its frames reach the kernels.
pub(super) fn start(
    input: PipelineInput,
    publishers: CameraPublishers,
    logger: &str,
    backend: &str,
    gpu: Option<&Arc<GpuShare>>,
) -> Result<Started> {
    // The cause names the description (`gst:...`), the context the input.
    let in_input =
        |e: Error| Error::Ros { context: format!("input {}", input.index), message: e.to_string() };
    let mut source = CaptureSource::start_on(&input.description, gpu.cloned()).map_err(in_input)?;
    let reads = Arc::new(LentReads::default());
    source.count_reads_in(reads.clone());
    // A live source negotiates its caps with its first frame: wait for it, so that caps
    // that cannot be negotiated stop the node as for a source that is not live. The frame
    // is the capture thread's first.
    let first = source.next(FIRST_FRAME_WAIT).map_err(in_input)?;
    if first.is_none() {
        r2r::log_warn!(
            logger,
            "input {} ({}): no frame within {} s of starting; the node goes on and restarts \
             the pipeline if none comes",
            input.index,
            input.name,
            FIRST_FRAME_WAIT.as_secs()
        );
    }
    r2r::log_info!(
        logger,
        "input {} ({}): GStreamer pipeline `{}`, {}; frames {}; header.frame_id `{}`, \
         camera_info {}, image_raw published only while subscribed",
        input.index,
        input.name,
        input.description,
        if source.is_live() {
            "live: stamps are capture times"
        } else {
            "not live: stamps are arrival times"
        },
        pipeline_copies(backend),
        input.frame_id,
        if input.calibration.is_some() {
            "from camera_info_urls"
        } else {
            "not published (no calibration)"
        },
    );
    Ok(Started { input, source, publishers, first, reads, gpu: gpu.cloned() })
}

impl Cameras {
    /// Run each started pipeline on its own thread, pushing frames into `former`.
    pub(super) fn run(
        started: Vec<Started>,
        stale_after_ms: u32,
        former: &Arc<Mutex<Former>>,
        shared: &Arc<Shared>,
    ) -> Result<Cameras> {
        let stop = Arc::new(AtomicBool::new(false));
        let stall = STALL_MIN.max(Duration::from_millis(u64::from(stale_after_ms)));
        let mut threads = Vec::new();
        for s in started {
            let index = s.input.index;
            {
                let mut st = lock(&shared.inputs[index]);
                st.topic = format!("gst:{}", s.input.description);
                st.qos = "in-process GStreamer pipeline (no DDS)".into();
                st.pipeline = Some(PipelineState {
                    running: true,
                    live: s.source.is_live(),
                    reads: s.reads.clone(),
                    ..PipelineState::default()
                });
            }
            lock(&shared.cameras)[index].topic = format!("gst:{}", s.input.description);
            if let Some(info) = &s.input.calibration {
                *lock(&shared.camera_infos[index]) = Some(info.clone());
            }
            let capture = Capture {
                input: s.input,
                publishers: s.publishers,
                former: former.clone(),
                shared: shared.clone(),
                stop: stop.clone(),
                stall,
                log: RateLimitedLog::new(&shared.clock),
                restart_log: RateLimitedLog::new(&shared.clock),
                size_checked: false,
                gpu: s.gpu,
                device_raw_said: false,
            };
            let (source, first) = (s.source, s.first);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("gst-{index}"))
                    .spawn(move || capture.run(source, first))
                    .map_err(|e| Error::io(format!("starting the thread of input {index}"), e))?,
            );
        }
        Ok(Cameras { stop, threads })
    }
}

impl Drop for Cameras {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let had_pipelines = !self.threads.is_empty();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if had_pipelines {
            crate::capture::release_idle_threads();
        }
    }
}

/// One capture thread's state.
struct Capture {
    input: PipelineInput,
    publishers: CameraPublishers,
    former: Arc<Mutex<Former>>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    stall: Duration,
    log: RateLimitedLog,
    restart_log: RateLimitedLog,
    /// The calibration's size was compared with the frames'.
    size_checked: bool,
    /// The backend's CUDA context, shared with the pipeline at each (re)start.
    gpu: Option<Arc<GpuShare>>,
    /// Frames in CUDA memory not published on `image_raw` (they have no host bytes) were
    /// said on the log.
    device_raw_said: bool,
}

impl Capture {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.shared.is_stopped()
    }

    /// Take frames until the node stops; restart the pipeline after each fault.
    fn run(mut self, started: CaptureSource, first: Option<Frame>) {
        if let Some(frame) = first {
            let (live, age) = (started.is_live(), capture_age(&frame, &started));
            self.deliver(frame, live, age);
        }
        let mut source = Some(started);
        let mut backoff = BACKOFF_MIN;
        let mut last_frame = Instant::now();
        while !self.stopping() {
            // The managed node while not active: the pipeline PAUSED until it is.
            if !self.shared.is_active() {
                source = self.paused(source);
                last_frame = Instant::now();
                continue;
            }
            let Some(running) = source.as_mut() else {
                self.sleep(backoff);
                if self.stopping() {
                    break;
                }
                source = self.restart();
                match source {
                    Some(_) => last_frame = Instant::now(),
                    None => backoff = (backoff * 2).min(BACKOFF_MAX),
                }
                continue;
            };
            match running.next(POLL) {
                Ok(Some(frame)) => {
                    backoff = BACKOFF_MIN;
                    last_frame = Instant::now();
                    let live = running.is_live();
                    let age = capture_age(&frame, running);
                    self.deliver(frame, live, age);
                }
                Ok(None) if last_frame.elapsed() < self.stall => {}
                Ok(None) => {
                    self.fault(&format!(
                        "no frame for {:.1} s: the pipeline is restarted",
                        last_frame.elapsed().as_secs_f64()
                    ));
                    if let Some(s) = source.take() {
                        let _ = s.stop();
                    }
                }
                Err(e) => {
                    self.fault(&e.to_string());
                    if let Some(s) = source.take() {
                        let _ = s.stop();
                    }
                }
            }
        }
        if let Some(s) = source.take() {
            let _ = s.stop();
        }
    }

    /// The managed node is not active: pause the pipeline, wait until the node is active
    /// again or stops, and play it again. A pipeline that cannot pause or play again is
    /// stopped (a fault: restarted once the node is active).
    fn paused(&mut self, mut source: Option<CaptureSource>) -> Option<CaptureSource> {
        if let Some(Err(e)) = source.as_mut().map(CaptureSource::pause) {
            self.fault(&e.to_string());
            if let Some(s) = source.take() {
                let _ = s.stop();
            }
        }
        while !self.stopping() && !self.shared.is_active() {
            std::thread::sleep(PAUSE_POLL);
        }
        if self.stopping() {
            return source;
        }
        if let Some(Err(e)) = source.as_mut().map(CaptureSource::resume) {
            self.fault(&e.to_string());
            if let Some(s) = source.take() {
                let _ = s.stop();
            }
        }
        source
    }

    /// Start the pipeline again: counted and logged (rate-limited), or the fault.
    fn restart(&mut self) -> Option<CaptureSource> {
        match CaptureSource::start_on(&self.input.description, self.gpu.clone()) {
            Ok(mut s) => {
                let mut st = lock(&self.shared.inputs[self.input.index]);
                if let Some(p) = st.pipeline.as_mut() {
                    p.running = true;
                    p.restarts += 1;
                    p.live = s.is_live();
                    s.count_reads_in(p.reads.clone());
                }
                drop(st);
                let line =
                    format!("input {} ({}): pipeline restarted", self.input.index, self.input.name);
                self.restart_log.info(&self.shared.logger, &line);
                Some(s)
            }
            Err(e) => {
                self.fault(&e.to_string());
                None
            }
        }
    }

    /// Wait `d`, or less when the node stops.
    fn sleep(&self, d: Duration) {
        let until = Instant::now() + d;
        while !self.stopping() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(POLL));
        }
    }

    /// A run-time fault: counted, shown in `/diagnostics`, logged (rate-limited) as a
    /// warning; the pipeline is (re)started after the backoff.
    fn fault(&mut self, what: &str) {
        let mut st = lock(&self.shared.inputs[self.input.index]);
        if let Some(p) = st.pipeline.as_mut() {
            p.running = false;
            p.faults += 1;
            p.last_fault = Some((what.to_string(), Instant::now()));
        }
        drop(st);
        let line = format!(
            "input {} ({}): {what}; restarting the pipeline (backoff {} to {} s)",
            self.input.index,
            self.input.name,
            BACKOFF_MIN.as_secs_f64(),
            BACKOFF_MAX.as_secs_f64()
        );
        self.log.warn(&self.shared.logger, &line);
    }

    /// Give `frame` its header, push it into the former, then publish what a camera
    /// driver would (camera_info; the raw image while subscribed).
    fn deliver(&mut self, frame: Frame, live: bool, age: Option<Duration>) {
        let at = Instant::now();
        let stamp = self.stamp(live, age);
        let header = Header {
            sec: i32::try_from(stamp.as_secs()).unwrap_or(i32::MAX),
            nanosec: stamp.subsec_nanos(),
            frame_id: self.input.frame_id.clone(),
        };
        let frame = Arc::new(frame);
        let index = self.input.index;
        {
            let mut st = lock(&self.shared.inputs[index]);
            if let Some(p) = st.pipeline.as_mut() {
                if frame.copied() {
                    p.copied += 1;
                } else {
                    p.in_place += 1;
                    p.not_lent += u64::from(!frame.is_lent() && frame.device().is_none());
                }
            }
        }
        let captured = Captured { frame: frame.clone(), header: header.clone() };
        let received = Received::new(Pixels::Captured(captured), at);
        {
            let mut former = lock(&self.former);
            former.push(index, received, &self.shared);
            former.poll(&self.shared);
        }
        self.publish(&frame, &header);
    }

    /// The frame's stamp on the node's clock: for a live source its capture time (the
    /// node's now less the frame's age on the pipeline clock); else, or without a clock,
    /// its arrival. Zero while the node's clock has no time (sim time before `/clock`).
    fn stamp(&self, live: bool, age: Option<Duration>) -> Duration {
        let Some(now) = self.shared.clock.now() else { return Duration::ZERO };
        match age {
            Some(age) if live => now.saturating_sub(age),
            _ => now,
        }
    }

    /// camera_info with every frame (when calibrated), the frame on `image_raw` while
    /// someone subscribes.
    fn publish(&mut self, frame: &Frame, header: &Header) {
        let ros_header = super::native::ros_header(header);
        if let Some(cal) = &self.input.calibration {
            if !self.size_checked {
                self.size_checked = true;
                if (cal.width, cal.height) != (frame.width(), frame.height()) {
                    r2r::log_warn!(
                        &self.shared.logger,
                        "input {} ({}): the calibration is for {}x{}, the frames are {}x{}: \
                         camera_info is published as calibrated; recalibrate at the frames' \
                         size",
                        self.input.index,
                        self.input.name,
                        cal.width,
                        cal.height,
                        frame.width(),
                        frame.height()
                    );
                }
            }
            let info = CameraInfo { header: ros_header.clone(), ..cal.clone() };
            if let Err(e) = self.publishers.info.publish(&info) {
                self.log.warn(&self.shared.logger, &format!("publishing camera_info: {e}"));
            }
        }
        if self.publishers.image.get_inter_process_subscription_count().unwrap_or(0) == 0 {
            return;
        }
        let Some(view) = frame.view() else {
            if !std::mem::replace(&mut self.device_raw_said, true) {
                r2r::log_info!(
                    &self.shared.logger,
                    "input {} ({}): image_raw is not published: its frames are in CUDA \
                     memory (read in place by the GPU, never on the host)",
                    self.input.index,
                    self.input.name
                );
            }
            return;
        };
        let msg = Image {
            header: ros_header,
            height: view.height(),
            width: view.width(),
            encoding: view.encoding().name().to_string(),
            is_bigendian: u8::from(view.big_endian()),
            step: view.step(),
            data: view.data().to_vec(),
        };
        match self.publishers.image.publish(&msg) {
            Ok(()) => {
                let mut st = lock(&self.shared.inputs[self.input.index]);
                if let Some(p) = st.pipeline.as_mut() {
                    p.raw_published += 1;
                }
            }
            Err(e) => self.log.warn(&self.shared.logger, &format!("publishing image_raw: {e}")),
        }
    }
}

/// How long ago `frame` was captured, on its pipeline's clock; `None` without a capture
/// time or clock, or when the difference is not believable.
fn capture_age(frame: &Frame, source: &CaptureSource) -> Option<Duration> {
    let captured = frame.capture_time()?.clock_ns;
    let now = source.clock_now_ns()?;
    let age = Duration::from_nanos(now.checked_sub(captured)?);
    (age <= LARGEST_AGE).then_some(age)
}
