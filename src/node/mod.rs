//! The ROS 2 node: subscribes to `image` (and, optionally, `camera_info`), publishes
//! `tensor`, `timing`, `tensor/camera_info` and `/diagnostics`.
//!
//! Shape (r2r + tokio): a blocking spin loop; an ingest task that keeps only the newest
//! frame and counts what it replaces; one processing thread that owns the pipeline (and
//! so the backend and its stream) and publishes; the parameter services and a 1 Hz
//! diagnostics task on the runtime. Ctrl-C / SIGTERM stop ingest, let the frame in
//! flight finish, and exit 0. Log records go to `/rosout` too ([`rosout`]); times
//! relative to the world follow the node's ROS clock ([`clock`], `use_sim_time`).

mod clock;
mod param_services;
mod params;
mod play;
mod record;
mod rosout;
mod stats;

use crate::pipeline::{select_backend, FrameInfo, Geometry, Pipeline};
use crate::ImageView;
use futures::StreamExt;
use r2r::diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus};
use r2r::sensor_msgs::msg::{CameraInfo, Image, RegionOfInterest};
use r2r::vision_preproc_msgs::msg::{FrameTiming, Tensor};
use r2r::QosProfile;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

pub use crate::bag::{PlayOptions, PlayStats, RecordOptions, RecordStats};
pub use clock::NodeClock;
pub use params::{descriptor, NodeParams, Spec, PARAMETERS, USE_SIM_TIME};
pub use play::play;
pub use record::record;
pub use stats::{BackendInfo, Counts, Stats};

/// The node's name (`ros2 node list` shows `/vision_preproc` unless remapped).
pub const NODE_NAME: &str = "vision_preproc";

/// Seconds between two logs of rejected frames (the count in between is logged).
const REJECT_LOG_PERIOD: Duration = Duration::from_secs(2);

/// The node's logger name once the node exists (`ns.vision_preproc` in a namespace).
static LOGGER: OnceLock<String> = OnceLock::new();

/// Entry point of `vision_preproc_node`.
pub fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Through rcutils, like every other line: `[FATAL] [<time>] [<logger>]: ...`
            // (RCUTILS_CONSOLE_OUTPUT_FORMAT applies).
            let logger = LOGGER.get().map(String::as_str).unwrap_or(NODE_NAME);
            r2r::log_fatal!(logger, "{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A frame as received, with the instant it arrived.
struct Received {
    msg: Image,
    at: Instant,
}

/// Keep-latest hand-over between ingest and processing.
#[derive(Default)]
struct Latest {
    slot: Mutex<Option<Received>>,
    ready: Condvar,
    shutdown: AtomicBool,
}

impl Latest {
    fn put(&self, r: Received, stats: &Stats) {
        stats.received.fetch_add(1, Ordering::Relaxed);
        if lock(&self.slot).replace(r).is_some() {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.ready.notify_one();
    }

    /// The next frame, or `None` once shut down.
    fn take(&self) -> Option<Received> {
        let mut slot = lock(&self.slot);
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            if let Some(r) = slot.take() {
                return Some(r);
            }
            slot = self
                .ready
                .wait_timeout(slot, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Stop: the frame in flight finishes; a frame still waiting is counted as dropped.
    fn stop(&self, stats: &Stats) {
        self.shutdown.store(true, Ordering::Release);
        if lock(&self.slot).take().is_some() {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.ready.notify_all();
    }
}

fn qos(profile: crate::config::QosProfile, depth: u32) -> QosProfile {
    use crate::config::QosProfile as P;
    let base = match profile {
        P::SensorData => QosProfile::sensor_data(),
        P::Default => QosProfile::default(),
        P::SystemDefault => QosProfile::system_default(),
    };
    base.keep_last(depth as usize)
}

/// The Fast DDS profile for camera-sized samples shipped with the package, if
/// `FASTDDS_DEFAULT_PROFILES_FILE` is not already set: next to the executable in a colcon
/// install (`lib/vision_preproc/` -> `share/vision_preproc/config/`), else in the source
/// tree the binary was built from.
fn default_dds_profile() -> Option<PathBuf> {
    if std::env::var_os("FASTDDS_DEFAULT_PROFILES_FILE").is_some() {
        return None;
    }
    let name = "fastdds_large_frames.xml";
    let installed = std::env::current_exe().ok().and_then(|exe| {
        Some(exe.parent()?.parent()?.parent()?.join("share/vision_preproc/config").join(name))
    });
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("config").join(name);
    installed.into_iter().chain([source]).find(|p| p.is_file())
}

/// Publishers the processing thread uses.
struct Outputs {
    tensor: r2r::Publisher<Tensor>,
    timing: r2r::Publisher<FrameTiming>,
    camera_info: r2r::Publisher<CameraInfo>,
    debug_image: r2r::Publisher<Image>,
}

/// State shared between the tasks and the processing thread.
struct Shared {
    latest: Latest,
    stats: Stats,
    params: Arc<Mutex<NodeParams>>,
    camera_info: Mutex<Option<CameraInfo>>,
    logger: String,
    /// The node's clock (ROS time; `/clock` with `use_sim_time`).
    clock: NodeClock,
    /// What diagnostics say about the backend (changes when `gpu_failure_policy` acts).
    backend: Mutex<BackendInfo>,
    /// Set by the processing thread when the node must exit with an error
    /// (`gpu_failure_policy: exit`), with `fatal_signal` notified.
    fatal: Mutex<Option<String>>,
    fatal_signal: tokio::sync::Notify,
}

fn run() -> anyhow::Result<()> {
    // Before the DDS participant exists, while this process has one thread.
    let dds_profile = default_dds_profile();
    if let Some(p) = &dds_profile {
        std::env::set_var("FASTDDS_DEFAULT_PROFILES_FILE", p);
    }
    let ctx = r2r::Context::create()?;
    let mut node = r2r::Node::create(ctx, NODE_NAME, "")?;
    let logger = node.logger().to_string();
    let _ = LOGGER.set(logger.clone());
    // Before anything logs from another thread (the handler swap is not synchronized).
    let rosout = rosout::Rosout::install(&mut node, &logger)?;
    let status_name = node.fully_qualified_name()?.trim_start_matches('/').to_string();
    if let Some(p) = &dds_profile {
        r2r::log_info!(&logger, "Fast DDS profile for large samples: {}", p.display());
    }

    // Parameters: command line / params file over the defaults, validated; names the
    // node does not have (a shared `/**` file) are ignored with a warning.
    let (node_params, unknown) = {
        let overrides = lock(&node.params);
        NodeParams::from_overrides(overrides.iter().map(|(k, p)| (k.as_str(), &p.value)))?
    };
    for u in &unknown {
        r2r::log_warn!(&logger, "parameter {u}");
    }
    let config = node_params.config.clone();
    let clock = NodeClock::of(&node);
    clock.request_sim_time(node_params.use_sim_time);
    let params = Arc::new(Mutex::new(node_params));
    let param_server =
        param_services::start(&mut node, params.clone(), clock.clone(), logger.clone())?;

    let (backend, fallback) = select_backend(&config)?;
    if let Some(reason) = &fallback {
        r2r::log_warn!(&logger, "backend auto: no usable GPU, using the CPU backend ({reason})");
    }
    let backend_info = BackendInfo {
        name: backend.name().to_string(),
        device: backend.device_description(),
        details: backend.diagnostics(),
        fallback,
        gpu_failure: None,
    };
    r2r::log_info!(
        &logger,
        "backend {} ({}); network input {}x{} {} {} {:?}",
        backend_info.name,
        backend_info.device,
        config.network_image_width,
        config.network_image_height,
        config.output_layout.name(),
        config.output_dtype.name(),
        config.resize_mode
    );
    let in_qos = qos(config.input_qos, config.input_qos_depth);
    let images = node.subscribe::<Image>("image", in_qos.clone())?;
    let camera_infos = node.subscribe::<CameraInfo>("camera_info", in_qos)?;
    let out_qos = qos(config.output_qos, config.output_qos_depth);
    let outputs = Outputs {
        tensor: node.create_publisher::<Tensor>("tensor", out_qos.clone())?,
        timing: node.create_publisher::<FrameTiming>("timing", out_qos.clone())?,
        camera_info: node.create_publisher::<CameraInfo>("tensor/camera_info", out_qos.clone())?,
        debug_image: node.create_publisher::<Image>("debug_image", out_qos)?,
    };
    let diagnostics =
        node.create_publisher::<DiagnosticArray>("/diagnostics", QosProfile::default())?;
    let pipeline = Pipeline::new(config, backend)?;

    let shared = Arc::new(Shared {
        latest: Latest::default(),
        stats: Stats::default(),
        params,
        camera_info: Mutex::new(None),
        logger: logger.clone(),
        clock: clock.clone(),
        backend: Mutex::new(backend_info),
        fatal: Mutex::new(None),
        fatal_signal: tokio::sync::Notify::new(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;

    // Spin: r2r delivers subscription messages and service requests from spin_once.
    let spin_shared = shared.clone();
    // The node is handed back when spinning stops, and kept until the end of `run`:
    // dropping it invalidates every publisher, and the frame in flight, the last
    // /diagnostics status and the final log still need them.
    let spinner = std::thread::Builder::new().name("spin".into()).spawn(move || {
        let mut sim_time = false;
        while !spin_shared.latest.shutdown.load(Ordering::Acquire) {
            // use_sim_time as set (start-up, `ros2 param set`): the /clock subscription
            // belongs to the node, so it is made here.
            if let Err(e) = spin_shared.clock.apply(&mut node, &mut sim_time) {
                r2r::log_error!(&spin_shared.logger, "use_sim_time: {e}");
                sim_time = spin_shared.clock.sim_time();
            }
            node.spin_once(Duration::from_millis(20));
        }
        node
    })?;

    // Processing: owns the pipeline.
    let proc_shared = shared.clone();
    let processor = std::thread::Builder::new()
        .name("process".into())
        .spawn(move || process_loop(pipeline, &proc_shared, &outputs))?;

    rt.block_on(async {
        let tasks = [
            tokio::spawn(ingest(images, shared.clone())),
            tokio::spawn(keep_camera_info(camera_infos, shared.clone())),
            tokio::spawn(param_server),
            tokio::spawn(publish_diagnostics(
                diagnostics.clone(),
                shared.clone(),
                status_name.clone(),
            )),
        ];
        tokio::select! {
            _ = shutdown_signal() => {}
            _ = shared.fatal_signal.notified() => {}
        }
        r2r::log_info!(&logger, "shutting down");
        shared.latest.stop(&shared.stats);
        for t in tasks {
            t.abort();
        }
    });
    processor.join().map_err(|_| anyhow::anyhow!("processing thread panicked"))?;
    let _node = spinner.join().map_err(|_| anyhow::anyhow!("spin thread panicked"))?;
    let c = shared.stats.counts();
    r2r::log_info!(
        &logger,
        "stopped: {} frames received, {} published, {} dropped (queue), {} rejected (invalid), {} failed",
        c.received,
        c.published,
        c.dropped,
        c.rejected,
        c.failed
    );
    if let Some(reason) = lock(&shared.fatal).take() {
        // A last /diagnostics status saying why, before the node goes away.
        let backend = lock(&shared.backend).clone();
        let (mut status, _) = shared.stats.status(&status_name, c, 1.0, &backend);
        status.level = DiagnosticStatus::ERROR as u8;
        status.message = format!("exiting: {reason}");
        let mut msg = DiagnosticArray { status: vec![status], ..Default::default() };
        msg.header.stamp = shared.clock.stamp();
        if let Err(e) = diagnostics.publish(&msg) {
            r2r::log_warn!(&logger, "publishing /diagnostics: {e}");
        }
        linger();
        drop(rosout);
        anyhow::bail!("{reason}");
    }
    linger();
    drop(rosout);
    Ok(())
}

/// How long the node stays after its last publication, so that reliable subscribers get
/// the last samples (the tensor of the frame that was in flight at the signal, a last
/// /diagnostics status) before the publishers go away: exiting at once lost that tensor
/// now and then (seen once in 2 + 2 shutdown tests: published 9, received 8). r2r 0.9
/// does not expose `rcl_publisher_wait_for_all_acked`, which would wait exactly as long
/// as needed.
const SHUTDOWN_LINGER: Duration = Duration::from_millis(300);

fn linger() {
    std::thread::sleep(SHUTDOWN_LINGER);
}

async fn ingest(mut images: impl futures::Stream<Item = Image> + Unpin, shared: Arc<Shared>) {
    while let Some(msg) = images.next().await {
        shared.latest.put(Received { msg, at: Instant::now() }, &shared.stats);
    }
}

/// Keep the newest camera_info; it is read, never waited for, on the hot path.
async fn keep_camera_info(
    mut infos: impl futures::Stream<Item = CameraInfo> + Unpin,
    shared: Arc<Shared>,
) {
    while let Some(info) = infos.next().await {
        *lock(&shared.camera_info) = Some(info);
    }
}

/// Seconds of the node's clock between two `/diagnostics` statuses.
const DIAGNOSTICS_PERIOD: Duration = Duration::from_secs(1);

/// How often the diagnostics task looks at the node's clock (steady time).
const CLOCK_POLL: Duration = Duration::from_millis(20);

/// One status per [`DIAGNOSTICS_PERIOD`] of the node's clock (with sim time: per
/// simulated second; none while `/clock` stands still), rates over that clock's seconds.
async fn publish_diagnostics(
    publisher: r2r::Publisher<DiagnosticArray>,
    shared: Arc<Shared>,
    name: String,
) {
    let mut poll = tokio::time::interval(CLOCK_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut previous = Counts::default();
    let mut last: Option<Duration> = None;
    loop {
        poll.tick().await;
        let Some(now) = shared.clock.now() else {
            continue;
        };
        let Some(start) = last.filter(|&l| l <= now) else {
            // First time, or the clock went back (a looped bag): start a new window.
            last = Some(now);
            previous = shared.stats.counts();
            continue;
        };
        let seconds = (now - start).as_secs_f64();
        if seconds < DIAGNOSTICS_PERIOD.as_secs_f64() {
            continue;
        }
        last = Some(now);
        let backend = lock(&shared.backend).clone();
        let (status, counts) = shared.stats.status(&name, previous, seconds, &backend);
        previous = counts;
        let mut msg = DiagnosticArray { status: vec![status], ..Default::default() };
        msg.header.stamp = clock::to_stamp(now);
        if let Err(e) = publisher.publish(&msg) {
            r2r::log_warn!(&shared.logger, "publishing /diagnostics: {e}");
        }
    }
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Logs rejected frames at most once per [`REJECT_LOG_PERIOD`] of the node's clock, with
/// the count between.
struct RateLimitedLog {
    throttle: clock::Throttle,
    clock: NodeClock,
    suppressed: u64,
}

impl RateLimitedLog {
    fn error(&mut self, logger: &str, what: &str) {
        if !self.throttle.ready(self.clock.now()) {
            self.suppressed += 1;
            return;
        }
        if self.suppressed > 0 {
            r2r::log_error!(logger, "{what} (and {} more since the last message)", self.suppressed);
        } else {
            r2r::log_error!(logger, "{what}");
        }
        self.suppressed = 0;
    }
}

fn process_loop(mut pipeline: Pipeline, shared: &Shared, out: &Outputs) {
    let logger = shared.logger.as_str();
    let mut sequence = 0u64;
    let mut dropped_reported = 0u64;
    let mut generation = 0u64;
    let mut reject_log = RateLimitedLog {
        throttle: clock::Throttle::new(REJECT_LOG_PERIOD),
        clock: shared.clock.clone(),
        suppressed: 0,
    };
    let mut debug_throttle = clock::Throttle::new(Duration::ZERO);
    while let Some(frame) = shared.latest.take() {
        // Parameters set at run time apply from this frame (validated when set).
        {
            let p = lock(&shared.params);
            if p.generation != generation {
                generation = p.generation;
                if let Err(e) = pipeline.set_config(p.config.clone()) {
                    r2r::log_error!(logger, "new parameters not applied: {e}");
                }
            }
        }
        let msg = &frame.msg;
        let view = ImageView::new(
            msg.width,
            msg.height,
            msg.step,
            &msg.encoding,
            msg.is_bigendian != 0,
            &msg.data,
        );
        let info = match view.map_err(crate::Error::from).and_then(|v| pipeline.process(&v)) {
            Ok(info) => info,
            Err(crate::Error::Image(e)) => {
                let reason = e.to_string();
                reject_log.error(logger, &format!("frame rejected: invalid image: {reason}"));
                shared.stats.rejected(reason);
                continue;
            }
            Err(e @ crate::Error::GpuFailure { .. }) => {
                // gpu_failure_policy exit: count the frame, stop the node with the reason.
                let reason = e.to_string();
                r2r::log_fatal!(logger, "{reason}; the node exits");
                shared.stats.failed(reason.clone());
                *lock(&shared.fatal) = Some(reason);
                shared.latest.stop(&shared.stats);
                shared.fatal_signal.notify_one();
                break;
            }
            Err(e) => {
                reject_log.error(logger, &format!("frame failed: {e}"));
                shared.stats.failed(e.to_string());
                continue;
            }
        };
        if let Some(failure) = &info.gpu_failure {
            r2r::log_error!(logger, "GPU failure: {}", failure.reason);
            r2r::log_warn!(logger, "{failure}");
            shared.stats.gpu_failures.fetch_add(1, Ordering::Relaxed);
            let backend = pipeline.backend();
            let mut b = lock(&shared.backend);
            b.name = backend.name().to_string();
            b.device = backend.device_description();
            b.details = backend.diagnostics();
            b.gpu_failure = Some((failure.reason.clone(), failure.to_string()));
        }
        let tensor = tensor_message(
            msg,
            &info,
            pipeline.config().tensor_name.clone(),
            pipeline.tensor_bytes(),
        );
        if let Err(e) = out.tensor.publish(&tensor) {
            reject_log.error(logger, &format!("publishing tensor: {e}"));
            shared.stats.failed(format!("publishing tensor: {e}"));
            continue;
        }
        if let Some(info_msg) = lock(&shared.camera_info).as_ref() {
            let scaled = scaled_camera_info(info_msg, &info.geometry, msg);
            if let Err(e) = out.camera_info.publish(&scaled) {
                r2r::log_warn!(logger, "publishing tensor/camera_info: {e}");
            }
        }
        let total_us = frame.at.elapsed().as_secs_f32() * 1e6;
        shared.stats.published(total_us / 1000.0);
        publish_debug_image(&pipeline, msg, &out.debug_image, &mut debug_throttle, shared);
        let dropped = shared.stats.dropped.load(Ordering::Relaxed);
        let timing = FrameTiming {
            header: msg.header.clone(),
            sequence,
            backend: pipeline.backend().name().to_string(),
            upload_us: info.times.upload_us,
            preprocess_us: info.times.preprocess_us,
            conv_us: info.times.conv_us,
            download_us: info.times.download_us,
            total_us,
            age_us: clock::age_us(shared.clock.now(), &msg.header.stamp),
            dropped_since_last: u32::try_from(dropped - dropped_reported).unwrap_or(u32::MAX),
        };
        dropped_reported = dropped;
        if let Err(e) = out.timing.publish(&timing) {
            r2r::log_warn!(logger, "publishing timing: {e}");
        }
        sequence += 1;
    }
}

/// `debug_image`: what the network sees, de-normalized to rgb8 (grey tensors as mono8),
/// computed only while someone subscribes and at most `debug_image_rate` times a second
/// of the node's clock.
fn publish_debug_image(
    pipeline: &Pipeline,
    src: &Image,
    publisher: &r2r::Publisher<Image>,
    throttle: &mut clock::Throttle,
    shared: &Shared,
) {
    let logger = shared.logger.as_str();
    let rate = pipeline.config().debug_image_rate;
    if rate <= 0.0 || publisher.get_inter_process_subscription_count().unwrap_or(0) == 0 {
        return;
    }
    throttle.set_period(Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::MAX));
    if !throttle.ready(shared.clock.now()) {
        return;
    }
    let preview = match pipeline.preview_image() {
        Ok(p) => p,
        Err(e) => {
            r2r::log_warn!(logger, "debug_image: {e}");
            return;
        }
    };
    let msg = Image {
        header: src.header.clone(),
        height: preview.height,
        width: preview.width,
        encoding: if preview.channels == 3 { "rgb8" } else { "mono8" }.to_string(),
        is_bigendian: 0,
        step: preview.width * preview.channels,
        data: preview.data,
    };
    if let Err(e) = publisher.publish(&msg) {
        r2r::log_warn!(logger, "publishing debug_image: {e}");
    }
}

fn tensor_message(src: &Image, info: &FrameInfo, name: String, bytes: &[u8]) -> Tensor {
    let g = &info.geometry;
    Tensor {
        header: src.header.clone(),
        name,
        layout: info.desc.layout.name().to_string(),
        dtype: info.desc.dtype.name().to_string(),
        shape: info.desc.shape().to_vec(),
        data: bytes.to_vec(),
        scale_x: g.scale_x as f32,
        scale_y: g.scale_y as f32,
        offset_x: g.offset_x as f32,
        offset_y: g.offset_y as f32,
        source_width: g.source_width,
        source_height: g.source_height,
        source_encoding: src.encoding.clone(),
    }
}

/// The camera_info of the network image: the source's, scaled and offset exactly like
/// the image (see [`Geometry::scale_intrinsics`]), stamped like the tensor.
fn scaled_camera_info(src: &CameraInfo, g: &Geometry, image: &Image) -> CameraInfo {
    let mut out = src.clone();
    out.header = image.header.clone();
    if !src.header.frame_id.is_empty() {
        out.header.frame_id = src.header.frame_id.clone();
    }
    out.width = g.network_width;
    out.height = g.network_height;
    let mut k = [0.0; 9];
    let mut p = [0.0; 12];
    let kn = src.k.len().min(9);
    let pn = src.p.len().min(12);
    k[..kn].copy_from_slice(&src.k[..kn]);
    p[..pn].copy_from_slice(&src.p[..pn]);
    g.scale_intrinsics(&mut k, &mut p);
    out.k = k.to_vec();
    out.p = p.to_vec();
    // The network image is the whole output: no further binning or roi applies.
    out.binning_x = 0;
    out.binning_y = 0;
    out.roi = RegionOfInterest::default();
    out
}
