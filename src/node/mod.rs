//! The ROS 2 node: subscribes to `image`, publishes `tensor` and `timing`.
//!
//! Shape (r2r + tokio): a blocking spin loop; an ingest task that keeps only the newest
//! frame and counts what it replaces; one processing thread that owns the pipeline (and
//! so the backend and its stream) and publishes. Ctrl-C / SIGTERM stop ingest, let the
//! frame in flight finish, and exit 0.

mod params;

use crate::pipeline::{select_backend, FrameInfo, Pipeline};
use crate::ImageView;
use futures::StreamExt;
use r2r::sensor_msgs::msg::Image;
use r2r::vision_preproc_msgs::msg::{FrameTiming, Tensor};
use r2r::QosProfile;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use params::config_from_params;

/// The node's name (`ros2 node list` shows `/vision_preproc` unless remapped).
pub const NODE_NAME: &str = "vision_preproc";

/// Entry point of `vision_preproc_node`.
pub fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("[FATAL] [{NODE_NAME}]: {e:#}");
            ExitCode::FAILURE
        }
    }
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
    received: AtomicU64,
    /// Frames replaced in the slot before processing took them.
    dropped: AtomicU64,
    shutdown: AtomicBool,
}

impl Latest {
    fn put(&self, r: Received) {
        self.received.fetch_add(1, Ordering::Relaxed);
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if slot.replace(r).is_some() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.ready.notify_one();
    }

    /// The next frame, or `None` once shut down and empty.
    fn take(&self) -> Option<Received> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = slot.take() {
                return Some(r);
            }
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            slot = self
                .ready
                .wait_timeout(slot, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn stop(&self) {
        self.shutdown.store(true, Ordering::Release);
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

fn run() -> anyhow::Result<()> {
    // Before the DDS participant exists, while this process has one thread.
    let dds_profile = default_dds_profile();
    if let Some(p) = &dds_profile {
        std::env::set_var("FASTDDS_DEFAULT_PROFILES_FILE", p);
    }
    let ctx = r2r::Context::create()?;
    let mut node = r2r::Node::create(ctx, NODE_NAME, "")?;
    let logger = node.logger().to_string();
    if let Some(p) = &dds_profile {
        r2r::log_info!(&logger, "Fast DDS profile for large samples: {}", p.display());
    }

    let config = {
        let params = node.params.lock().unwrap_or_else(|p| p.into_inner());
        config_from_params(params.iter().map(|(k, p)| (k.as_str(), &p.value)))?
    };
    let (backend, fallback) = select_backend(&config)?;
    if let Some(reason) = &fallback {
        r2r::log_warn!(&logger, "backend auto: using the CPU backend ({reason})");
    }
    r2r::log_info!(
        &logger,
        "backend {} ({}); network input {}x{} {} {} {}",
        backend.name(),
        backend.device_description(),
        config.network_image_width,
        config.network_image_height,
        config.output_layout.name(),
        config.output_dtype.name(),
        serde_yaml::to_string(&config.resize_mode).unwrap_or_default().trim()
    );
    let images = node.subscribe::<Image>("image", qos(config.input_qos, config.input_qos_depth))?;
    let out_qos = qos(config.output_qos, config.output_qos_depth);
    let tensor_pub = node.create_publisher::<Tensor>("tensor", out_qos.clone())?;
    let timing_pub = node.create_publisher::<FrameTiming>("timing", out_qos)?;
    let pipeline = Pipeline::new(config, backend)?;

    let latest = Arc::new(Latest::default());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;

    // Spin: r2r delivers subscription messages and services from spin_once.
    let spin_latest = latest.clone();
    let spinner = std::thread::Builder::new().name("spin".into()).spawn(move || {
        while !spin_latest.shutdown.load(Ordering::Acquire) {
            node.spin_once(Duration::from_millis(20));
        }
    })?;

    // Processing: owns the pipeline.
    let proc_latest = latest.clone();
    let proc_logger = logger.clone();
    let processor = std::thread::Builder::new().name("process".into()).spawn(move || {
        process_loop(pipeline, &proc_latest, &tensor_pub, &timing_pub, &proc_logger)
    })?;

    rt.block_on(async {
        let ingest_latest = latest.clone();
        let ingest = tokio::spawn(ingest(images, ingest_latest));
        shutdown_signal().await;
        r2r::log_info!(&logger, "shutting down");
        latest.stop();
        ingest.abort();
    });
    processor.join().map_err(|_| anyhow::anyhow!("processing thread panicked"))?;
    spinner.join().map_err(|_| anyhow::anyhow!("spin thread panicked"))?;
    r2r::log_info!(
        &logger,
        "stopped: {} frames received, {} replaced before processing",
        latest.received.load(Ordering::Relaxed),
        latest.dropped.load(Ordering::Relaxed)
    );
    Ok(())
}

async fn ingest(mut images: impl futures::Stream<Item = Image> + Unpin, latest: Arc<Latest>) {
    while let Some(msg) = images.next().await {
        latest.put(Received { msg, at: Instant::now() });
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

fn process_loop(
    mut pipeline: Pipeline,
    latest: &Latest,
    tensor_pub: &r2r::Publisher<Tensor>,
    timing_pub: &r2r::Publisher<FrameTiming>,
    logger: &str,
) {
    let mut sequence = 0u64;
    let mut dropped_reported = 0u64;
    while let Some(frame) = latest.take() {
        let msg = &frame.msg;
        let view = ImageView::new(
            msg.width,
            msg.height,
            msg.step,
            &msg.encoding,
            msg.is_bigendian != 0,
            &msg.data,
        );
        let result = view.map_err(crate::Error::from).and_then(|v| pipeline.process(&v));
        let info = match result {
            Ok(info) => info,
            Err(e) => {
                r2r::log_error!(logger, "frame rejected: {e}");
                continue;
            }
        };
        let tensor = tensor_message(
            msg,
            &info,
            pipeline.config().tensor_name.clone(),
            pipeline.tensor_bytes(),
        );
        if let Err(e) = tensor_pub.publish(&tensor) {
            r2r::log_error!(logger, "publishing tensor: {e}");
        }
        let dropped = latest.dropped.load(Ordering::Relaxed);
        let timing = FrameTiming {
            header: msg.header.clone(),
            sequence,
            backend: pipeline.backend().name().to_string(),
            upload_us: info.times.upload_us,
            preprocess_us: info.times.preprocess_us,
            conv_us: info.times.conv_us,
            download_us: info.times.download_us,
            total_us: frame.at.elapsed().as_secs_f32() * 1e6,
            age_us: age_us(&msg.header.stamp),
            dropped_since_last: u32::try_from(dropped - dropped_reported).unwrap_or(u32::MAX),
        };
        dropped_reported = dropped;
        if let Err(e) = timing_pub.publish(&timing) {
            r2r::log_error!(logger, "publishing timing: {e}");
        }
        sequence += 1;
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

/// Now (system clock) minus the stamp, in microseconds.
fn age_us(stamp: &r2r::builtin_interfaces::msg::Time) -> f32 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let stamp_s = f64::from(stamp.sec) + f64::from(stamp.nanosec) * 1e-9;
    ((now.as_secs_f64() - stamp_s) * 1e6) as f32
}
