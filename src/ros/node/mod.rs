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
mod handoff;
mod input;
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
use crate::config::{Config, InputSource};
use crate::error::{Error, Result};
use crate::pipeline::{open_backend, Pipeline};
use crate::transport::dds;
use r2r::diagnostic_msgs::msg::DiagnosticArray;
use r2r::QosProfile;
use shared::{lock, output_qos, Outputs, Shared};
use std::process::ExitCode;
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
    let logger = || LOGGER.get().map(String::as_str).unwrap_or(NODE_NAME);
    // Through rcutils, like every other line: `[FATAL] [<time>] [<logger>]: ...`
    // (RCUTILS_CONSOLE_OUTPUT_FORMAT applies).
    match run() {
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
}

/// Listen for signals, read the parameters, set up DDS and create the node with its
/// `/rosout` and clock.
fn create_node() -> Result<(Base, r2r::Node)> {
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

/// Start the pipeline inputs of `config` (each with its publishers): one that cannot
/// start stops the node with the cause.
fn open_cameras(
    node: &mut r2r::Node,
    config: &Config,
    logger: &str,
    backend: &str,
) -> Result<Vec<camera::Started>> {
    camera::PipelineInput::of(config)?
        .into_iter()
        .map(|p| {
            let publishers = camera::CameraPublishers::create(node, &p.name)
                .map_err(|e| ros_err(&format!("creating the publishers of {}", p.name), e))?;
            camera::start(p, publishers, logger, backend)
        })
        .collect()
}

/// The node's threads, running: spin, cameras, processing; the `/diagnostics` publisher.
struct Running {
    spinner: std::thread::JoinHandle<r2r::Node>,
    diagnostics: r2r::Publisher<DiagnosticArray>,
    cameras: camera::Cameras,
    decoders: video::Decoders,
    processor: std::thread::JoinHandle<()>,
    former: Arc<Mutex<former::Former>>,
    shared: Arc<Shared>,
}

/// Open the backend, the outputs and the inputs, then start the node's threads.
fn start(base: &Base, mut node: r2r::Node, ros_args: Option<RosArgs>) -> Result<Running> {
    let (logger, config) = (base.logger.as_str(), &base.config);
    let (backend, backend_info) = start_backend(config, logger)?;
    let inputs = config.input_count();
    let qos = output_qos(config.output_qos, config.output_qos_depth);
    let outputs = Outputs::create(&mut node, inputs, &qos)
        .map_err(|e| ros_err("creating the output publishers", e))?;
    log_batching(logger, config);
    let pipelines = open_cameras(&mut node, config, logger, &backend_info.name)?;
    let former = Arc::new(Mutex::new(former::Former::new(config)));
    let diagnostics = node
        .create_publisher::<DiagnosticArray>("/diagnostics", QosProfile::default())
        .map_err(|e| ros_err("creating the /diagnostics publisher", e))?;
    let ref_topic = tensor_ref_topic(&node, ros_args.as_ref())?;
    let feeds = video::feeds(config);
    video::log_decoders(logger, config, &feeds);
    let subscriptions = spin::Subscriptions {
        topics: topic_inputs(config, &feeds),
        preset: config.input_qos,
        depth: config.input_qos_depth,
        participants: config.input_participants,
        ros_args,
    };
    let stale_after_ms = config.stale_after_ms;
    let pipeline = Pipeline::new(config.clone(), backend)?;
    let (params, clock) = (base.params.clone(), base.clock.clone());
    let shared = Arc::new(Shared::new(inputs, params, logger.to_string(), clock, backend_info));
    for (i, feed) in &feeds {
        lock(&shared.inputs[*i]).video = Some(feed.clone());
    }
    // The node is handed back when spinning stops, and kept until the end of `run`:
    // dropping it invalidates every publisher, and the set in flight, the last
    // /diagnostics status and the final log still need them.
    let spinner = spin::start(node, subscriptions, former.clone(), &shared)?;
    let cameras = camera::Cameras::run(pipelines, stale_after_ms, &former, &shared)?;
    let decoders = video::Decoders::run(&feeds, &former, &shared)?;
    let handoff = handoff::Handoff::start(
        &pipeline,
        &shared,
        outputs.tensor.clone(),
        outputs.tensor_ref.clone(),
        ref_topic,
    );
    let proc_shared = shared.clone();
    let processor = std::thread::Builder::new()
        .name("process".into())
        .spawn(move || process::process_loop(pipeline, &proc_shared, outputs, handoff))
        .map_err(|e| Error::io("starting the processing thread", e))?;
    Ok(Running { spinner, diagnostics, cameras, decoders, processor, former, shared })
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
    let ros_args = base.ros_args.take();
    let running = start(&base, node, ros_args)?;
    wait_for_stop(&mut base, &running, param_server);
    stop(base, running)
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

/// Stop the threads, count and log what is left, and say why the node exits: `None` for a
/// clean stop, the fatal error's reason (after a last `/diagnostics` status saying it).
fn stop(base: Base, running: Running) -> Result<Option<String>> {
    let Running { spinner, diagnostics, cameras, decoders, processor, former, shared } = running;
    // Every thread that pushes frames stops (pipelines to NULL, their threads joined)
    // before the former counts what it still holds.
    drop(cameras);
    drop(decoders);
    let panicked = |thread: &str| Error::misuse(thread, "the thread panicked");
    processor.join().map_err(|_| panicked("processing thread"))?;
    let _node = spinner.join().map_err(|_| panicked("spin thread"))?;
    lock(&former).finish(&shared);
    log_stopped(&base.logger, &shared);
    let fatal = lock(&shared.fatal).take();
    if let Some(reason) = &fatal {
        // A last /diagnostics status saying why, before the node goes away.
        diagnostics::publish_exit(&diagnostics, &shared, &base.status_name, reason);
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

/// The resolved name of `tensor_ref` (namespace, remaps), for the hand-off's log lines.
fn tensor_ref_topic(node: &r2r::Node, ros_args: Option<&RosArgs>) -> Result<String> {
    let err = |e| ros_err("reading the node's name", e);
    let (name, namespace) = (node.name().map_err(err)?, node.namespace().map_err(err)?);
    Ok(ros_args
        .and_then(|a| a.resolve_topic("tensor_ref", &name, &namespace))
        .unwrap_or_else(|| format!("{}/tensor_ref", namespace.trim_end_matches('/'))))
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
