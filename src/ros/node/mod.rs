//! The ROS 2 node: subscribes to `image` (and, optionally, `camera_info`), publishes
//! `tensor`, `timing`, `tensor/camera_info` and `/diagnostics`.
//!
//! Shape (r2r + tokio): a spin thread that owns the node's subscriptions: after each
//! `spin_once` it hands the images that arrived (native C messages, not copied) to the
//! keep-latest slot, which counts what it replaces, and with `input_qos: auto` adapts
//! the subscriptions to the publishers; one processing thread that owns the pipeline
//! (and so the backend and its stream), reads each frame in place and publishes the
//! `Tensor` the pipeline serialized in place (`publish_raw`) — with 2+ `inputs` a
//! publishing thread publishes each `TensorBatch` while the processing thread computes
//! the next batch into a second buffer ([`batch`]); the parameter services and a 1 Hz
//! diagnostics task on the runtime. Ctrl-C / SIGTERM stop ingest, let the frame in
//! flight finish, and exit 0. Log records go to `/rosout` too ([`rosout`]); times
//! relative to the world follow the node's ROS clock ([`clock`], `use_sim_time`).

mod batch;
mod clock;
mod input;
mod param_services;
mod params;
mod rosout;
mod stats;

use super::native::{self, ros_header, NativeImage, RosArgs};
use crate::pipeline::{frame_timing, select_backend, Geometry, Pipeline};
use crate::transport::{dds, delivery, Basis, Latest};
use r2r::diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus};
use r2r::sensor_msgs::msg::{CameraInfo, Image, RegionOfInterest};
use r2r::QosProfile;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

pub use clock::NodeClock;
pub use params::{descriptor, NodeParams, Spec, PARAMETERS, USE_SIM_TIME};
pub use stats::{BackendInfo, Counts, InputReport, Stats};

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

/// A frame as received (the C message rmw deserialized into), with the instant it
/// arrived.
struct Received {
    msg: NativeImage,
    at: Instant,
}

/// The QoS of the outputs.
fn qos(profile: crate::config::QosPreset, depth: u32) -> QosProfile {
    use crate::config::QosPreset as P;
    let base = match profile {
        P::SensorData => QosProfile::sensor_data(),
        // `auto` is refused for the outputs by `Config::validate`.
        P::Default | P::Auto => QosProfile::default(),
        P::SystemDefault => QosProfile::system_default(),
    };
    base.keep_last(depth as usize)
}

/// The Fast DDS transports of this process: the user's, or the node's own with its
/// shared-memory segment sized from its largest output.
enum DdsSetup {
    /// `FASTDDS_DEFAULT_PROFILES_FILE` (or `FASTDDS_BUILTIN_TRANSPORTS`) was given.
    User(String),
    /// The node wrote its own profile to this file, for outputs up to `largest` bytes.
    Sized { file: PathBuf, segment: usize, largest: usize },
}

impl DdsSetup {
    /// Before the DDS participant exists, while this process has one thread.
    fn configure(args: Option<&RosArgs>) -> anyhow::Result<DdsSetup> {
        // (An empty value counts as unset.)
        for var in [
            "FASTDDS_DEFAULT_PROFILES_FILE",
            "FASTRTPS_DEFAULT_PROFILES_FILE",
            "FASTDDS_BUILTIN_TRANSPORTS",
        ] {
            if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                return Ok(DdsSetup::User(format!("{var}={}", v.to_string_lossy())));
            }
        }
        let bound = args.map(RosArgs::output_bound).unwrap_or_default();
        let largest = dds::largest_output(&bound);
        let segment = dds::segment_size(largest);
        let udp = dds::socket_buffer_limit().map_or(dds::UDP_BUFFER, |l| l.min(dds::UDP_BUFFER));
        let file =
            std::env::temp_dir().join(format!("vision_preproc_fastdds_{}.xml", std::process::id()));
        std::fs::write(&file, dds::profile_xml(segment, udp)).map_err(|e| {
            anyhow::anyhow!(
                "writing the node's Fast DDS profile {}: {e}; set FASTDDS_DEFAULT_PROFILES_FILE \
                 to a profile of your own (e.g. config/fastdds_large_frames.xml) instead",
                file.display()
            )
        })?;
        std::env::set_var("FASTDDS_DEFAULT_PROFILES_FILE", &file);
        Ok(DdsSetup::Sized { file, segment, largest })
    }
}

impl Drop for DdsSetup {
    fn drop(&mut self) {
        if let DdsSetup::Sized { file, .. } = self {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// The Fast DDS profile for camera-sized samples shipped with the package, if
/// `FASTDDS_DEFAULT_PROFILES_FILE` is not already set: next to the executable in a colcon
/// install (`lib/vision_preproc/` -> `share/vision_preproc/config/`), else in the source
/// tree the binary was built from.
pub(super) fn default_dds_profile() -> Option<PathBuf> {
    if std::env::var_os("FASTDDS_DEFAULT_PROFILES_FILE").is_some() {
        return None;
    }
    shipped_dds_profile()
}

/// The shipped camera profile `fastdds_large_frames.xml` (installed, or in the source
/// tree), whatever the environment says.
fn shipped_dds_profile() -> Option<PathBuf> {
    let name = "fastdds_large_frames.xml";
    let installed = std::env::current_exe().ok().and_then(|exe| {
        Some(exe.parent()?.parent()?.parent()?.join("share/vision_preproc/config").join(name))
    });
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("config").join(name);
    installed.into_iter().chain([source]).find(|p| p.is_file())
}

/// Publishers the processing thread uses. `tensor` and `timing` publish the serialized
/// messages the pipeline and [`frame_timing`] write (`publish_raw`).
struct Outputs {
    tensor: r2r::PublisherUntyped,
    timing: r2r::PublisherUntyped,
    camera_info: r2r::Publisher<CameraInfo>,
    debug_image: r2r::Publisher<Image>,
    /// With 2+ inputs: `tensor/camera_info_<i>`, the scaled camera_info of batch item i.
    batch_camera_info: Vec<r2r::Publisher<CameraInfo>>,
}

/// The ROS type names of the raw-published outputs.
const TENSOR_TYPE: &str = "vision_preproc_msgs/msg/Tensor";
const TENSOR_BATCH_TYPE: &str = "vision_preproc_msgs/msg/TensorBatch";
const TIMING_TYPE: &str = "vision_preproc_msgs/msg/FrameTiming";

/// State shared between the tasks and the processing thread.
struct Shared {
    latest: Latest<Received>,
    /// With 2+ inputs: the keep-latest slot of formed batches.
    batches: Latest<batch::Formed>,
    stats: Stats,
    /// Each input as the spin thread sees it (topic, QoS, publishers, arrivals).
    inputs: Vec<Mutex<input::InputState>>,
    /// With 2+ inputs: each camera's counters and staleness.
    cameras: Mutex<Vec<batch::CameraState>>,
    batches_published: std::sync::atomic::AtomicU64,
    params: Arc<Mutex<NodeParams>>,
    /// The newest camera_info of each input.
    camera_infos: Vec<Mutex<Option<CameraInfo>>>,
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

impl Shared {
    /// Stop ingest and processing; a batch still waiting counts its frames as dropped.
    fn stop(&self) {
        self.latest.stop();
        if let Some(b) = self.batches.stop_and_take() {
            self.stats.dropped.fetch_add(b.new_frames(), Ordering::Relaxed);
        }
    }

    /// `gpu_failure_policy: exit` after a GPU failure, or another error the node cannot
    /// go on after (`reason`): log it, count the `frames` it took as failed, and stop the
    /// node with the reason. The caller's processing loop then ends.
    fn exit_fatal(&self, reason: String, frames: u64) {
        r2r::log_fatal!(self.logger.as_str(), "{reason}; the node exits");
        for _ in 0..frames {
            self.stats.failed(reason.clone());
        }
        *lock(&self.fatal) = Some(reason);
        self.stop();
        self.fatal_signal.notify_one();
    }
}

fn run() -> anyhow::Result<()> {
    let ros_args = RosArgs::parse();
    let dds_setup = DdsSetup::configure(ros_args.as_ref())?;
    let ctx = r2r::Context::create()?;
    let mut node = r2r::Node::create(ctx, NODE_NAME, "")?;
    let logger = node.logger().to_string();
    let _ = LOGGER.set(logger.clone());
    // Before anything logs from another thread (the handler swap is not synchronized).
    let rosout = rosout::Rosout::install(&mut node, &logger)?;
    let status_name = node.fully_qualified_name()?.trim_start_matches('/').to_string();

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
    match &dds_setup {
        DdsSetup::User(how) => r2r::log_info!(&logger, "Fast DDS transports: {how}"),
        DdsSetup::Sized { segment, largest, .. } => {
            r2r::log_info!(
                &logger,
                "Fast DDS: own shared-memory segment of {} MiB ({} samples of the largest \
                 output, {} bytes; FASTDDS_DEFAULT_PROFILES_FILE unset)",
                segment >> 20,
                dds::SEGMENT_SAMPLES,
                largest
            );
            let need = dds::largest_output(&config);
            if need > *largest {
                r2r::log_warn!(
                    &logger,
                    "the output ({need} bytes) is larger than the samples the shared-memory \
                     segment was sized for ({largest} bytes): tensors will travel over UDP; \
                     set FASTDDS_DEFAULT_PROFILES_FILE to a profile with a larger segment"
                );
            }
        }
    }
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
    let out_qos = qos(config.output_qos, config.output_qos_depth);
    let batching = config.is_batch();
    let topics = config.input_topics();
    let outputs = Outputs {
        tensor: node.create_publisher_untyped(
            "tensor",
            if batching { TENSOR_BATCH_TYPE } else { TENSOR_TYPE },
            out_qos.clone(),
        )?,
        timing: node.create_publisher_untyped("timing", TIMING_TYPE, out_qos.clone())?,
        camera_info: node.create_publisher::<CameraInfo>("tensor/camera_info", out_qos.clone())?,
        debug_image: node.create_publisher::<Image>("debug_image", out_qos.clone())?,
        batch_camera_info: if batching {
            (0..topics.len())
                .map(|i| {
                    node.create_publisher::<CameraInfo>(
                        &format!("tensor/camera_info_{i}"),
                        out_qos.clone(),
                    )
                })
                .collect::<r2r::Result<Vec<_>>>()?
        } else {
            Vec::new()
        },
    };
    if batching {
        r2r::log_info!(
            &logger,
            "batching {} cameras ({}), batch_policy {}: one TensorBatch on tensor",
            topics.len(),
            topics.join(", "),
            config.batch_policy.name()
        );
    }
    let former = batching.then(|| batch::Former::new(&config));
    let diagnostics =
        node.create_publisher::<DiagnosticArray>("/diagnostics", QosProfile::default())?;
    let (preset, depth) = (config.input_qos, config.input_qos_depth);
    let pipeline = Pipeline::new(config, backend)?;

    let stats = Stats::default();
    let shared = Arc::new(Shared {
        latest: Latest::with_counters(stats.received.clone(), stats.dropped.clone()),
        batches: Latest::default(),
        stats,
        inputs: topics.iter().map(|_| Mutex::new(input::InputState::default())).collect(),
        cameras: Mutex::new(vec![
            batch::CameraState::default();
            if batching { topics.len() } else { 0 }
        ]),
        batches_published: std::sync::atomic::AtomicU64::new(0),
        params,
        camera_infos: topics.iter().map(|_| Mutex::new(None)).collect(),
        logger: logger.clone(),
        clock: clock.clone(),
        backend: Mutex::new(backend_info),
        fatal: Mutex::new(None),
        fatal_signal: tokio::sync::Notify::new(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;

    // Spin: r2r delivers subscription messages and service requests from spin_once;
    // the input subscriptions live on this thread (their native messages are not Send
    // until wrapped), made there and reported back before anything else starts.
    let spin_shared = shared.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    // The node is handed back when spinning stops, and kept until the end of `run`:
    // dropping it invalidates every publisher, and the frame in flight, the last
    // /diagnostics status and the final log still need them.
    let spinner = std::thread::Builder::new().name("spin".into()).spawn(move || {
        let shared = spin_shared;
        let mut former = former;
        let mut inputs = Vec::with_capacity(topics.len());
        for (i, topic) in topics.iter().enumerate() {
            match input::Input::new(
                &mut node,
                ros_args.as_ref(),
                (i, topic),
                preset,
                depth,
                &shared,
            ) {
                Ok(input) => inputs.push(input),
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("subscribing to the input {topic}: {e}")));
                    return node;
                }
            }
        }
        {
            let mut cams = lock(&shared.cameras);
            for (cam, input) in cams.iter_mut().zip(&inputs) {
                cam.topic = input.topic().to_string();
            }
        }
        let _ = ready_tx.send(Ok(()));
        let mut sim_time = false;
        while !shared.latest.is_stopped() {
            // use_sim_time as set (start-up, `ros2 param set`): the /clock subscription
            // belongs to the node, so it is made here.
            if let Err(e) = shared.clock.apply(&mut node, &mut sim_time) {
                r2r::log_error!(&shared.logger, "use_sim_time: {e}");
                sim_time = shared.clock.sim_time();
            }
            let wait = former.as_ref().map_or(Duration::from_millis(20), |f| f.spin_timeout());
            node.spin_once(wait);
            for (i, input) in inputs.iter_mut().enumerate() {
                for r in input.drain(&shared) {
                    match former.as_mut() {
                        Some(f) => f.push(i, r, &shared),
                        None => {
                            shared.latest.put(r);
                        }
                    }
                }
            }
            if let Some(f) = former.as_mut() {
                f.poll(&shared);
            }
            for input in &mut inputs {
                if let Err(e) = input.adapt(&mut node, &shared) {
                    r2r::log_error!(&shared.logger, "input_qos auto: resubscribing: {e}");
                }
            }
        }
        if let Some(f) = former.as_mut() {
            f.finish(&shared);
        }
        node
    })?;
    if let Ok(Err(e)) | Err(e) = ready_rx.recv().map_err(|e| e.to_string()) {
        shared.stop();
        let _ = spinner.join();
        anyhow::bail!("{e}");
    }

    // Processing: owns the pipeline.
    let proc_shared = shared.clone();
    let processor = std::thread::Builder::new().name("process".into()).spawn(move || {
        if batching {
            batch::process_loop(pipeline, &proc_shared, outputs)
        } else {
            process_loop(pipeline, &proc_shared, &outputs)
        }
    })?;

    rt.block_on(async {
        let tasks = [
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
        shared.stop();
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
        drop(dds_setup);
        anyhow::bail!("{reason}");
    }
    linger();
    drop(rosout);
    drop(dds_setup);
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
    let mut warned = vec![false; shared.inputs.len()];
    let mut camera_previous: Vec<u64> = Vec::new();
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
        let report = if shared.inputs.len() >= 2 {
            batch_report(&shared, &mut warned, &mut camera_previous, seconds)
        } else {
            input_report(&shared, 0, "", &mut warned[0])
        };
        *lock(&shared.stats.input) = report;
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

/// The input part of `/diagnostics`: topic, QoS, publishers, delivery; and, while large
/// best-effort frames arrive at a fraction of the camera's rate, the warning (logged once
/// when it is raised, once when it clears).
/// With 2+ inputs: each camera's topic, QoS, publishers and delivery (keys prefixed
/// `Camera <i> `), its rate over the window, received / published / dropped / rejected
/// frames and staleness, and `Batches published`; the warning names the stale cameras
/// (else a camera's delivery warning).
fn batch_report(
    shared: &Shared,
    warned: &mut [bool],
    previous: &mut Vec<u64>,
    seconds: f64,
) -> InputReport {
    let cams = lock(&shared.cameras).clone();
    previous.resize(cams.len(), 0);
    let mut values = vec![(
        "Batches published".to_string(),
        shared.batches_published.load(Ordering::Relaxed).to_string(),
    )];
    let mut warnings = Vec::new();
    let mut stale = Vec::new();
    for (i, cam) in cams.iter().enumerate() {
        let prefix = format!("Camera {i} ");
        let report = input_report(shared, i, &prefix, &mut warned[i]);
        let rate = cam.counts.received.saturating_sub(previous[i]) as f64 / seconds.max(1e-9);
        previous[i] = cam.counts.received;
        let since = cam.last_arrival.map_or_else(
            || "no frame yet".to_string(),
            |t| format!("last frame {:.0} ms ago", t.elapsed().as_secs_f64() * 1e3),
        );
        values.extend(report.values);
        values.extend([
            (format!("{prefix}rate (Hz)"), format!("{rate:.2}")),
            (format!("{prefix}frames received"), cam.counts.received.to_string()),
            (format!("{prefix}frames published"), cam.published.to_string()),
            (format!("{prefix}frames dropped"), cam.counts.dropped.to_string()),
            (format!("{prefix}frames rejected"), cam.rejected.to_string()),
            (
                format!("{prefix}state"),
                format!("{} ({since})", if cam.stale { "stale" } else { "live" }),
            ),
        ]);
        if cam.stale {
            stale.push(format!("camera {i} ({})", cam.topic));
        }
        warnings.extend(report.warning.map(|w| format!("camera {i} ({}): {w}", cam.topic)));
    }
    let urgent = !stale.is_empty();
    let warning = if stale.is_empty() {
        warnings.into_iter().next()
    } else {
        Some(format!(
            "stale: {} (no frame for stale_after_ms; slot padded and flagged invalid)",
            stale.join(", ")
        ))
    };
    InputReport { values, warning, urgent }
}

fn input_report(shared: &Shared, index: usize, prefix: &str, warned: &mut bool) -> InputReport {
    let (topic, qos, publishers, best_effort, delivery, images_recently) = {
        let mut st = lock(&shared.inputs[index]);
        let now = Instant::now();
        let d = st.monitor.assess(now);
        let recent = st.monitor.images_recently(now);
        (st.topic.clone(), st.qos.clone(), st.publishers, st.best_effort, d, recent)
    };
    let mut values = vec![
        (format!("{prefix}Input topic"), topic.clone()),
        (format!("{prefix}Input QoS"), qos),
        (format!("{prefix}Input publishers"), publishers.to_string()),
    ];
    let losing = |d: &crate::transport::Delivery| {
        best_effort
            && d.fraction < delivery::RAISE_BELOW
            && (d.largest_bytes >= delivery::LARGE_SAMPLE || d.largest_bytes == 0)
    };
    let Some(d) = delivery else {
        // Not enough to judge this second (a late stamp in the fit): a raised warning
        // stays until frames are seen arriving at the camera's rate, the subscription is
        // no longer best effort, or no image came for STAMP_WINDOW (the camera is gone).
        if *warned && (!best_effort || !images_recently) {
            *warned = false;
            r2r::log_info!(&shared.logger, "input: no image arrives any more; warning cleared");
        }
        let warning = warned.then(|| {
            "frames lost before the node (large best-effort images; run the camera with \
             config/fastdds_large_frames.xml or reliable)"
                .to_string()
        });
        return InputReport { values, warning, urgent: false };
    };
    let basis = match d.basis {
        Basis::CameraInfo => "camera_info",
        Basis::Stamps => "image stamps",
    };
    values.push((
        format!("{prefix}Input delivery"),
        format!(
            "{:.1} of {:.1} frames/s arrive ({:.0} %; camera rate from {basis})",
            d.arrived_hz,
            d.camera_hz,
            100.0 * d.fraction
        ),
    ));
    if !*warned && losing(&d) {
        *warned = true;
        let profile = shipped_dds_profile().map_or_else(
            || "config/fastdds_large_frames.xml".to_string(),
            |p| p.display().to_string(),
        );
        r2r::log_warn!(
            &shared.logger,
            "frames are lost before they reach the node: {:.1} of the camera's ~{:.1} \
             frames/s arrive on {topic} ({:.1} MB best-effort images, camera rate from \
             {basis}). Large best-effort samples that do not fit the camera's Fast DDS \
             shared-memory segment go as UDP fragments, and one lost fragment loses the \
             frame. Fix: start the camera driver with FASTDDS_DEFAULT_PROFILES_FILE={profile}, \
             or make it publish reliable (input_qos auto then subscribes reliable)",
            d.arrived_hz,
            d.camera_hz,
            d.largest_bytes as f64 / 1e6
        );
    } else if *warned && (d.fraction >= delivery::CLEAR_ABOVE || !best_effort) {
        *warned = false;
        r2r::log_info!(&shared.logger, "input: frames arrive at the camera's rate again");
    }
    let warning = warned.then(|| {
        format!(
            "frames lost before the node: {:.1} of ~{:.1} frames/s arrive (large best-effort \
             images; run the camera with config/fastdds_large_frames.xml or reliable)",
            d.arrived_hz, d.camera_hz
        )
    });
    InputReport { values, warning, urgent: false }
}

pub(super) async fn shutdown_signal() {
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
    /// One log line per [`REJECT_LOG_PERIOD`] of the node's clock.
    fn new(clock: &NodeClock) -> Self {
        RateLimitedLog {
            throttle: clock::Throttle::new(REJECT_LOG_PERIOD),
            clock: clock.clone(),
            suppressed: 0,
        }
    }

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
    let mut reject_log = RateLimitedLog::new(&shared.clock);
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
        let header = msg.header();
        let info = match msg
            .view()
            .map_err(crate::Error::from)
            .and_then(|v| pipeline.process_message(&v, &header, msg.encoding()))
        {
            Ok(info) => info,
            Err(crate::Error::Image(e)) => {
                let reason = e.to_string();
                reject_log.error(logger, &format!("frame rejected: invalid image: {reason}"));
                shared.stats.rejected(reason);
                continue;
            }
            Err(e @ crate::Error::GpuFailure { .. }) => {
                // gpu_failure_policy exit: count the frame, stop the node with the reason.
                shared.exit_fatal(e.to_string(), 1);
                break;
            }
            Err(e) => {
                reject_log.error(logger, &format!("frame failed: {e}"));
                shared.stats.failed(e.to_string());
                continue;
            }
        };
        if let Some(failure) = &info.gpu_failure {
            note_gpu_failure(&pipeline, failure, shared);
        }
        // The pipeline wrote the whole serialized message in place: publish it as is.
        if let Err(e) = out.tensor.publish_raw(pipeline.message()) {
            reject_log.error(logger, &format!("publishing tensor: {e}"));
            shared.stats.failed(format!("publishing tensor: {e}"));
            continue;
        }
        let ros_header = ros_header(&header);
        if let Some(info_msg) = lock(&shared.camera_infos[0]).as_ref() {
            let scaled = scaled_camera_info(info_msg, &info.geometry, &ros_header);
            if let Err(e) = out.camera_info.publish(&scaled) {
                r2r::log_warn!(logger, "publishing tensor/camera_info: {e}");
            }
        }
        let total_us = frame.at.elapsed().as_secs_f32() * 1e6;
        shared.stats.published(total_us / 1000.0);
        publish_debug_image(&pipeline, &ros_header, &out.debug_image, &mut debug_throttle, shared);
        let dropped = shared.stats.dropped.load(Ordering::Relaxed);
        let timing = frame_timing(
            &header,
            sequence,
            pipeline.backend().name(),
            &info.times,
            total_us,
            clock::age_us(shared.clock.now(), &ros_header.stamp),
            u32::try_from(dropped - dropped_reported).unwrap_or(u32::MAX),
        );
        dropped_reported = dropped;
        if let Err(e) = out.timing.publish_raw(&timing.encode()) {
            r2r::log_warn!(logger, "publishing timing: {e}");
        }
        sequence += 1;
    }
}

/// A GPU failure the pipeline recovered from: logged, counted, and the backend as it is
/// now shown in diagnostics.
fn note_gpu_failure(pipeline: &Pipeline, failure: &crate::pipeline::GpuFailure, shared: &Shared) {
    let logger = shared.logger.as_str();
    r2r::log_error!(logger, "GPU failure: {}", failure.reason);
    r2r::log_warn!(logger, "{failure}");
    if failure.unreturned_messages > 0 {
        r2r::log_warn!(
            logger,
            "{} message(s) of the failed backend were still being published when it was \
             replaced (after waiting {} s)",
            failure.unreturned_messages,
            crate::pipeline::OUTSTANDING_WAIT.as_secs()
        );
    }
    shared.stats.gpu_failures.fetch_add(1, Ordering::Relaxed);
    let backend = pipeline.backend();
    let mut b = lock(&shared.backend);
    b.name = backend.name().to_string();
    b.device = backend.device_description();
    b.details = backend.diagnostics();
    b.gpu_failure = Some((failure.reason.clone(), failure.to_string()));
}

/// `debug_image`: what the network sees, de-normalized to rgb8 (grey tensors as mono8),
/// computed only while someone subscribes and at most `debug_image_rate` times a second
/// of the node's clock.
fn publish_debug_image(
    pipeline: &Pipeline,
    header: &r2r::std_msgs::msg::Header,
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
        header: header.clone(),
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

/// The camera_info of the network image: the source's, scaled and offset exactly like
/// the image (see [`Geometry::scale_intrinsics`]), stamped like the tensor.
fn scaled_camera_info(
    src: &CameraInfo,
    g: &Geometry,
    image: &r2r::std_msgs::msg::Header,
) -> CameraInfo {
    let mut out = src.clone();
    out.header = image.clone();
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
