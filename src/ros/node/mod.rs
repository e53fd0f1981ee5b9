//! The ROS 2 node: subscribes to `image` (or each of `inputs`, and the `camera_info` next
//! to each), publishes `tensor` (a `Tensor`, or with 2+ inputs a `TensorBatch`), `timing`,
//! the scaled camera_info, `debug_image` and `/diagnostics`. One camera is a batch of
//! one: the same threads and the same pipeline path for 1 and N inputs.
//!
//! This file is the wiring. Threads: the spin thread (`spin`: subscriptions, the
//! frame-set former of `former`, `input_qos: auto`), the processing and publishing
//! threads (`process`), and on a small runtime the parameter services
//! (`param_services`) and the 1 Hz status (`diagnostics`); they share `shared`.
//! Ctrl-C / SIGTERM stop ingest, let the set in flight finish, and exit 0. Log records go
//! to `/rosout` too (`rosout`); times relative to the world follow the node's ROS clock
//! (`clock`, `use_sim_time`).

mod calibration;
mod camera;
mod clock;
mod diagnostics;
mod former;
mod greenwave;
mod handoff;
mod input;
mod lifecycle;
mod managed;
mod param_services;
mod params;
mod process;
mod publish;
mod rosout;
mod shared;
mod spin;
mod stats;
mod video;

use super::dds::DdsSetup;
use super::native::{self, RosArgs};
use super::ros_err;
use crate::backend::Backend;
use crate::capture::GpuShare;
use crate::config::{Config, InputSource};
use crate::error::{Error, Result};
use crate::pipeline::{open_backend, Pipeline};
use crate::transport::dds;
use r2r::diagnostic_msgs::msg::DiagnosticArray;
use r2r::QosProfile;
use shared::{lock, output_qos, Outputs, Shared};
use std::process::ExitCode;
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub(crate) use clock::NodeClock;
pub(crate) use params::NodeParams;
pub use stats::{BackendInfo, Counts, InputReport, Stats};

/// The node's name (`ros2 node list` shows `/vision_preproc` unless remapped).
pub(crate) const NODE_NAME: &str = "vision_preproc";

/// The node's logger name once the node exists (`ns.vision_preproc` in a namespace).
static LOGGER: OnceLock<String> = OnceLock::new();

/// Entry point of `vision_preproc_node`.
pub fn main() -> ExitCode {
    exit_code(run())
}

pub use managed::main as managed_main;

/// The exit code of a node's run, its fatal error logged.
fn exit_code(run: Result<Option<String>>) -> ExitCode {
    let logger = || LOGGER.get().map(String::as_str).unwrap_or(NODE_NAME);
    // Through rcutils, like every other line: `[FATAL] [<time>] [<logger>]: ...`
    // (RCUTILS_CONSOLE_OUTPUT_FORMAT applies).
    match run {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(reason)) => {
            r2r::log_fatal!(logger(), "{reason}");
            ExitCode::FAILURE
        }
        Err(e) => {
            r2r::log_fatal!(logger(), "{e}");
            ExitCode::FAILURE
        }
    }
}

/// The node's parameters, read once from the command line (`--params-file`, `-p`) before
/// the DDS participant exists: the Fast DDS segment is sized from the same configuration
/// the node runs with.
fn read_parameters(args: Option<&RosArgs>) -> Result<(NodeParams, Vec<String>)> {
    let overrides = args.map(|a| a.parameter_overrides(NODE_NAME)).unwrap_or_default();
    let (params, unknown) =
        NodeParams::from_overrides(overrides.iter().map(|(k, v)| (k.as_str(), v)))?;
    Ok((params, unknown.iter().map(|u| format!("parameter {u}")).collect()))
}

/// Log which Fast DDS runs the node and how its transports were set up.
fn log_dds(logger: &str, setup: &DdsSetup) {
    let (fastdds, _) = super::dds::describe();
    match setup {
        DdsSetup::User(how) => r2r::log_info!(logger, "Fast DDS {fastdds}: transports {how}"),
        DdsSetup::Sized { segment, largest, file } => r2r::log_info!(
            logger,
            "Fast DDS {fastdds}: own shared-memory segment of {} MiB ({} samples of the \
             largest output, {} bytes; no profile was given), {}={}",
            segment >> 20,
            dds::SEGMENT_SAMPLES,
            largest,
            super::dds::profile_var(),
            file.display()
        ),
    }
}

/// The configured backend (a warning when `auto` fell back to the CPU) and what
/// `/diagnostics` says of it.
fn start_backend(config: &Config, logger: &str) -> Result<(Box<dyn Backend>, BackendInfo)> {
    let (backend, fallback) = open_backend(config, |w| r2r::log_warn!(logger, "{w}"))?;
    let backend_info = BackendInfo {
        name: backend.name().to_string(),
        device: backend.device_description(),
        details: backend.diagnostics(),
        fallback,
        gpu_failure: None,
    };
    r2r::log_info!(
        logger,
        "backend {} ({}); network input {}x{} {} {} {:?}",
        backend_info.name,
        backend_info.device,
        config.network_image_width,
        config.network_image_height,
        config.output_layout.name(),
        config.output_dtype.name(),
        config.resize_mode
    );
    // Where the CUDA kernels came from: embedded at build time, or compiled now (NVRTC,
    // another architecture or a build without NVRTC) and why.
    if let Some((_, kernels)) = backend_info.details.iter().find(|(k, _)| k == "GPU kernels") {
        r2r::log_info!(logger, "GPU kernels: {kernels}");
    }
    // NVTX ranges (src/nvtx.rs): said only when a profiler asked for them.
    if crate::nvtx::failed() {
        r2r::log_warn!(logger, "NVTX ranges {}", crate::nvtx::status());
    } else if crate::nvtx::enabled() {
        r2r::log_info!(logger, "NVTX ranges {}", crate::nvtx::status());
    }
    Ok((backend, backend_info))
}

/// The node before its inputs and threads: the runtime and the signals it listens to, the
/// r2r node with its logger, `/rosout`, parameters, clock and DDS set-up.
struct Base {
    rt: tokio::runtime::Runtime,
    signals: super::ShutdownSignals,
    ros_args: Option<RosArgs>,
    logger: String,
    /// The name `/diagnostics` statuses carry.
    status_name: String,
    rosout: Option<rosout::Rosout>,
    dds_setup: DdsSetup,
    config: Config,
    clock: NodeClock,
    params: Arc<Mutex<NodeParams>>,
    /// The managed node's lifecycle state (`None`: the plain node).
    lifecycle: Option<Arc<AtomicU8>>,
}

/// Listen for signals, read the parameters, set up DDS and create the node with its
/// `/rosout` and clock.
fn create_node() -> Result<(Base, r2r::Node)> {
    crate::backend::cpu::name_worker_threads();
    // Listen for SIGINT/SIGTERM before anything else: a signal during start-up then
    // ends the node as a later one does (it used to kill it, or be lost).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the tokio runtime", e))?;
    let signals = {
        let _context = rt.enter();
        super::ShutdownSignals::listen().map_err(|e| Error::io("listening for signals", e))?
    };
    let ros_args = RosArgs::parse();
    // Parameters: command line / params file over the defaults, validated; names the
    // node does not have (a shared `/**` file) are ignored with a warning. An invalid
    // value stops the node once it can say so (on /rosout too); the DDS segment of that
    // short life is sized for the defaults.
    let parsed = read_parameters(ros_args.as_ref());
    let (dds_setup, dds_warning) =
        DdsSetup::configure(parsed.as_ref().map_or(&Config::default(), |(p, _)| &p.config))?;
    let ctx = r2r::Context::create().map_err(|e| ros_err("creating the ROS context", e))?;
    let mut node =
        r2r::Node::create(ctx, NODE_NAME, "").map_err(|e| ros_err("creating the node", e))?;
    let logger = node.logger().to_string();
    let _ = LOGGER.set(logger.clone());
    // Before anything logs from another thread (the handler swap is not synchronized).
    let rosout = rosout::Rosout::install(&mut node, &logger)
        .map_err(|e| ros_err("creating the /rosout publisher", e))?;
    let status_name = node
        .fully_qualified_name()
        .map_err(|e| ros_err("reading the node's name", e))?
        .trim_start_matches('/')
        .to_string();
    let (node_params, unknown) = parsed?;
    let config = node_params.config.clone();
    for w in unknown.iter().chain(&dds_warning) {
        r2r::log_warn!(&logger, "{w}");
    }
    log_dds(&logger, &dds_setup);
    let clock = NodeClock::of(&node);
    clock.request_sim_time(node_params.use_sim_time);
    let params = Arc::new(Mutex::new(node_params));
    let base = Base {
        rt,
        signals,
        ros_args,
        logger,
        status_name,
        rosout,
        dds_setup,
        config,
        clock,
        params,
        lifecycle: None,
    };
    Ok((base, node))
}

/// The topic inputs of `config` (the pipeline inputs are the cameras'), with the video
/// feeds of those that carry video.
fn topic_inputs(
    config: &Config,
    feeds: &[(usize, Arc<crate::capture::VideoFeed>)],
) -> Vec<spin::TopicInput> {
    config
        .input_sources()
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            InputSource::Topic(t) => Some(spin::TopicInput {
                index: i,
                topic: t.clone(),
                transport: config.input_transport(i),
                video: feeds.iter().find(|(j, _)| *j == i).map(|(_, f)| f.clone()),
            }),
            InputSource::Pipeline(_) => None,
        })
        .collect()
}

/// Start the pipeline inputs of `config` (each with its publishers, kept in `made`): one
/// that cannot start stops the node (the managed node: fails configure) with the cause.
fn open_cameras(
    node: &mut r2r::Node,
    config: &Config,
    logger: &str,
    (backend, gpu, made): (&dyn Backend, Option<&Arc<GpuShare>>, &mut Made),
) -> Result<Vec<camera::Started>> {
    camera::PipelineInput::of(config)?
        .into_iter()
        .map(|p| {
            let publishers = camera::CameraPublishers::create(node, &p.name)
                .map_err(|e| ros_err(&format!("creating the publishers of {}", p.name), e))?;
            made.cameras.push(publishers.clone());
            camera::start(p, publishers, logger, backend.name(), gpu)
        })
        .collect()
}

/// The GPU backend's CUDA context shared with the CUDA elements of the pipeline inputs
/// and the video inputs' decode pipelines, so that their frames may come in CUDA memory
/// and be read in place; `None` (said on the log) for the CPU backend, without GStreamer's
/// CUDA library, or when no input runs a GStreamer pipeline: frames in system memory.
fn share_gpu(backend: &dyn Backend, config: &Config, logger: &str) -> Option<Arc<GpuShare>> {
    let pipelines = config.input_sources().iter().any(|s| matches!(s, InputSource::Pipeline(_)));
    if !pipelines && !video::has_video_inputs(config) {
        return None;
    }
    let device = backend.device_context()?;
    match GpuShare::new(device) {
        Ok(share) => {
            r2r::log_info!(
                logger,
                "pipeline and video inputs share the GPU's CUDA context: frames in CUDA \
                 memory (`{}`, NV12 from nvh264dec / nvh265dec) are read in place on the device",
                crate::capture::CUDA_MEMORY_FEATURE
            );
            Some(share)
        }
        Err(why) => {
            r2r::log_warn!(
                logger,
                "pipeline and video inputs in system memory only, not CUDA memory: {why}"
            );
            None
        }
    }
}

/// What starting made on the node: clones of its publishers, which the managed node
/// destroys at cleanup (r2r keeps a publisher until its node destroys it).
#[derive(Default)]
struct Made {
    outputs: Option<Outputs>,
    cameras: Vec<camera::CameraPublishers>,
}

impl Made {
    fn destroy(self, node: &mut r2r::Node) {
        if let Some(o) = self.outputs {
            o.destroy(node);
        }
        for c in self.cameras {
            c.destroy(node);
        }
    }
}

/// The node's threads, running: spin, cameras, processing; the `/diagnostics` publisher.
struct Running {
    spinner: std::thread::JoinHandle<r2r::Node>,
    diagnostics: DiagnosticsPublishers,
    cameras: camera::Cameras,
    decoders: video::Decoders,
    processor: std::thread::JoinHandle<()>,
    former: Arc<Mutex<former::Former>>,
    shared: Arc<Shared>,
    made: Made,
}

/// What [`open`] opened before the node's threads start.
struct Opened {
    backend: Box<dyn Backend>,
    backend_info: BackendInfo,
    outputs: Outputs,
    pipelines: Vec<camera::Started>,
    /// The CUDA context shared with the video inputs' decode pipelines.
    gpu: Option<Arc<GpuShare>>,
    ref_topic: String,
    /// The resolved `tensor` and `tensor_ref` (the greenwave statuses).
    output_topics: [String; 2],
}

/// Open the backend, the outputs and the pipeline inputs (`made` keeps the publishers).
fn open(base: &Base, node: &mut r2r::Node, made: &mut Made) -> Result<Opened> {
    let (logger, config) = (base.logger.as_str(), &base.config);
    let (backend, backend_info) = start_backend(config, logger)?;
    let qos = output_qos(config.output_qos, config.output_qos_depth);
    let outputs = Outputs::create(node, config.input_count(), &qos)
        .map_err(|e| ros_err("creating the output publishers", e))?;
    made.outputs = Some(outputs.clone());
    log_batching(logger, config);
    let gpu = share_gpu(backend.as_ref(), config, logger);
    let pipelines = open_cameras(node, config, logger, (backend.as_ref(), gpu.as_ref(), made))?;
    let ref_topic = resolved_topic(node, base.ros_args.as_ref(), "tensor_ref")?;
    let output_topics =
        [resolved_topic(node, base.ros_args.as_ref(), "tensor")?, ref_topic.clone()];
    Ok(Opened { backend, backend_info, outputs, pipelines, gpu, ref_topic, output_topics })
}

/// A start that failed: its error, and the node when it could be kept (what the start
/// made on it destroyed).
type Failed = Box<(Error, Option<r2r::Node>)>;

/// Open the backend, the outputs and the inputs, then start the node's threads (with
/// `active` false, the managed node's configure: frames are not taken until it is
/// activated). On failure the node comes back with what was made on it destroyed.
fn start(
    base: &Base,
    mut node: r2r::Node,
    diagnostics: DiagnosticsPublishers,
    active: bool,
) -> std::result::Result<Running, Failed> {
    let mut made = Made::default();
    let opened = match open(base, &mut node, &mut made) {
        Ok(o) => o,
        Err(e) => return Err(failed(e, Some(node), made)),
    };
    let config = &base.config;
    let former = Arc::new(Mutex::new(former::Former::new(config)));
    let feeds = video::feeds(config, opened.gpu.as_ref());
    video::log_decoders(&base.logger, config, &feeds);
    let subscriptions = spin::Subscriptions {
        topics: topic_inputs(config, &feeds),
        preset: config.input_qos,
        depth: config.input_qos_depth,
        participants: config.input_participants,
        // Moved to the spin thread (parsed again: each start has its own).
        ros_args: RosArgs::parse(),
    };
    let (params, clock) = (base.params.clone(), base.clock.clone());
    let inputs = config.input_count();
    let backend_topics = (opened.backend_info, &opened.output_topics[..]);
    let mut shared = Shared::new(inputs, params, base.logger.clone(), clock, backend_topics);
    shared.lifecycle = base.lifecycle.clone();
    *shared.active.get_mut() = active;
    let shared = Arc::new(shared);
    for (i, feed) in &feeds {
        lock(&shared.inputs[*i]).video = Some(feed.clone());
    }
    let pipeline = match Pipeline::new(config.clone(), opened.backend) {
        Ok(p) => p,
        Err(e) => return Err(failed(e, Some(node), made)),
    };
    // The node is handed back when spinning stops, and kept until the end of `run`:
    // dropping it invalidates every publisher, and the set in flight, the last
    // /diagnostics status and the final log still need them.
    let spinner = match spin::start(node, subscriptions, former.clone(), &shared) {
        Ok(s) => s,
        Err(f) => return Err(failed(f.0, f.1, made)),
    };
    let work = (pipeline, opened.outputs, opened.ref_topic);
    match spawn_threads(config, (opened.pipelines, &feeds), work, &former, &shared) {
        Ok((cameras, decoders, processor)) => {
            Ok(Running { spinner, diagnostics, cameras, decoders, processor, former, shared, made })
        }
        Err(e) => {
            shared.stop();
            Err(failed(e, spinner.join().ok(), made))
        }
    }
}

/// A failed start's result: what it made on the node destroyed.
fn failed(e: Error, mut node: Option<r2r::Node>, made: Made) -> Failed {
    if let Some(n) = node.as_mut() {
        made.destroy(n);
    }
    Box::new((e, node))
}

/// Start the capture threads of the pipeline inputs, the decoding threads of the video
/// inputs and the processing thread.
fn spawn_threads(
    config: &Config,
    (pipelines, feeds): (Vec<camera::Started>, &[(usize, Arc<crate::capture::VideoFeed>)]),
    (pipeline, outputs, ref_topic): (Pipeline, Outputs, String),
    former: &Arc<Mutex<former::Former>>,
    shared: &Arc<Shared>,
) -> Result<(camera::Cameras, video::Decoders, std::thread::JoinHandle<()>)> {
    let cameras = camera::Cameras::run(pipelines, config.stale_after_ms, former, shared)?;
    let decoders = video::Decoders::run(feeds, former, shared)?;
    let handoff = handoff::Handoff::start(
        &pipeline,
        shared,
        outputs.tensor.clone(),
        outputs.tensor_ref.clone(),
        ref_topic,
    );
    let proc_shared = shared.clone();
    let processor = std::thread::Builder::new()
        .name("process".into())
        .spawn(move || process::process_loop(pipeline, &proc_shared, outputs, handoff))
        .map_err(|e| Error::io("starting the processing thread", e))?;
    Ok((cameras, decoders, processor))
}

fn run() -> Result<Option<String>> {
    let (mut base, mut node) = create_node()?;
    let param_server = param_services::start(
        &mut node,
        base.params.clone(),
        base.clock.clone(),
        base.logger.clone(),
    )
    .map_err(|e| ros_err("creating the parameter services", e))?;
    let diagnostics = diagnostics_publisher(&mut node)?;
    let running = start(&base, node, diagnostics, true).map_err(|f| f.0)?;
    wait_for_stop(&mut base, &running, param_server);
    stop(base, running)
}

/// `/diagnostics`, and `consumer_timing` (the statuses of the consumers on the ready
/// signal alone).
pub(super) type DiagnosticsPublishers = [r2r::Publisher<DiagnosticArray>; 2];

/// The `/diagnostics` and `consumer_timing` publishers.
fn diagnostics_publisher(node: &mut r2r::Node) -> Result<DiagnosticsPublishers> {
    let diagnostics = node
        .create_publisher::<DiagnosticArray>("/diagnostics", QosProfile::default())
        .map_err(|e| ros_err("creating the /diagnostics publisher", e))?;
    let consumer_timing = node
        .create_publisher::<DiagnosticArray>("consumer_timing", QosProfile::default())
        .map_err(|e| ros_err("creating the consumer_timing publisher", e))?;
    Ok([diagnostics, consumer_timing])
}

/// Serve the parameters and publish `/diagnostics` until a signal or a fatal error; then
/// stop ingest.
fn wait_for_stop(
    base: &mut Base,
    running: &Running,
    param_server: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (signals, shared) = (&mut base.signals, &running.shared);
    base.rt.block_on(async {
        let tasks = [
            tokio::spawn(param_server),
            tokio::spawn(diagnostics::publish_diagnostics(
                running.diagnostics.clone(),
                shared.clone(),
                base.status_name.clone(),
            )),
        ];
        tokio::select! {
            _ = signals.recv() => {}
            _ = shared.fatal_signal.notified() => {}
        }
        r2r::log_info!(&base.logger, "shutting down");
        shared.stop();
        for t in tasks {
            t.abort();
        }
    });
}

/// Stop the node's threads (ingest first, then the set in flight finished and published)
/// and count what is left; the node comes back with the publishers the start made on
/// it, and the shared state with the fatal error, if any.
fn stop_threads(running: Running) -> Result<(r2r::Node, Made, Arc<Shared>)> {
    let Running { spinner, diagnostics: _, cameras, decoders, processor, former, shared, made } =
        running;
    shared.stop();
    // Every thread that pushes frames stops (pipelines to NULL, their threads joined)
    // before the former counts what it still holds.
    drop(cameras);
    drop(decoders);
    let panicked = |thread: &str| Error::misuse(thread, "the thread panicked");
    processor.join().map_err(|_| panicked("processing thread"))?;
    let node = spinner.join().map_err(|_| panicked("spin thread"))?;
    lock(&former).finish(&shared);
    Ok((node, made, shared))
}

/// Stop the threads, count and log what is left, and say why the node exits: `None` for a
/// clean stop, the fatal error's reason (after a last `/diagnostics` status saying it).
fn stop(base: Base, running: Running) -> Result<Option<String>> {
    let diagnostics = running.diagnostics.clone();
    let (_node, _made, shared) = stop_threads(running)?;
    log_stopped(&base.logger, &shared);
    let fatal = lock(&shared.fatal).take();
    if let Some(reason) = &fatal {
        // A last /diagnostics status saying why, before the node goes away.
        diagnostics::publish_exit(&diagnostics[0], &shared, &base.status_name, reason);
    }
    linger();
    drop(base.rosout);
    drop(base.dds_setup);
    Ok(fatal)
}

/// With 2+ inputs, the start-up line that says how the cameras are batched.
fn log_batching(logger: &str, config: &Config) {
    let topics = &config.inputs;
    if config.is_batch() {
        r2r::log_info!(
            logger,
            "batching {} cameras ({}), batch_policy {}, input_participants {}: one TensorBatch \
             on tensor",
            topics.len(),
            topics.join(", "),
            config.batch_policy.name(),
            config.input_participants.name()
        );
    }
}

/// The resolved name of output `topic` (namespace, remaps), for the hand-off's log lines
/// and the greenwave statuses.
fn resolved_topic(node: &r2r::Node, ros_args: Option<&RosArgs>, topic: &str) -> Result<String> {
    let err = |e| ros_err("reading the node's name", e);
    let (name, namespace) = (node.name().map_err(err)?, node.namespace().map_err(err)?);
    Ok(ros_args
        .and_then(|a| a.resolve_topic(topic, &name, &namespace))
        .unwrap_or_else(|| format!("{}/{topic}", namespace.trim_end_matches('/'))))
}

/// The final log lines: each pipeline input's host copies (the ledger), then the node's
/// books.
fn log_stopped(logger: &str, shared: &Shared) {
    let backend = shared::lock(&shared.backend).name.clone();
    for (i, input) in shared.inputs.iter().enumerate() {
        if let Some(p) = shared::lock(input).pipeline.as_ref() {
            r2r::log_info!(logger, "input {i}, frame copies: {}", p.copies(&backend));
        }
    }
    let c = shared.stats.counts();
    r2r::log_info!(
        logger,
        "stopped: {} frames received, {} published, {} dropped (queue), {} rejected (invalid), {} failed; \
         {} sets overlapped",
        c.received,
        c.published,
        c.dropped,
        c.rejected,
        c.failed,
        c.overlapped
    );
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
