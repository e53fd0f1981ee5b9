//! `vision_preproc bench-batch`: N cameras through ONE batched pipeline
//! (`Pipeline::process_frames` with N inputs, what a node with `inputs` of N topics runs) against N
//! single-camera pipelines (N nodes), both sides in one process, on the same backend and
//! frames. Three figures, each batched vs separate:
//! - work per batch: the backend's stage times (CUDA: event times of upload, fused
//!   kernel, conv2d, download) of one batch against N single frames;
//! - highest rate: back to back for `--seconds`, batched on one thread against the N
//!   pipelines on N threads at once (as N processes would share the GPU);
//! - latency at `--rate` Hz per camera: batched, every period one batch of the N frames;
//!   separate, N threads each one frame per period; wall time from the period's tick to
//!   the serialized message ready to publish (no DDS).
//!
//! On the CUDA backend two more, on the backend itself (`Backend::submit_into` of a
//! batch or a frame, then `finish_oldest`, two in flight, the copy stream uploading batch k+1 while batch k computes
//! and downloads): the highest rate of the pipelined batch, and of one camera pipelined
//! against one camera synchronous; with the byte ledger (H2D and D2H bytes per batch)
//! and the rate the PCIe link allows for those bytes, measured in the same run
//! (`CudaBackend::link_rates`: the roof of both sides).
//!
//! Frames are synthetic (the work does not depend on pixel values), one per camera.

use anyhow::{Context, Result};
use clap::Args;
use std::time::{Duration, Instant};
use vision_preproc::percentile::Summary;
use vision_preproc::pipeline::{select_backend, FrameInput};
use vision_preproc::wire::msgs::Header;
use vision_preproc::{Config, ImageView, Pipeline};

/// Arguments of `bench-batch`.
#[derive(Args, Debug)]
pub struct BenchBatchArgs {
    /// Backend: auto, cuda or cpu.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Cameras.
    #[arg(long, default_value_t = 4)]
    pub cameras: usize,
    /// Source frame width.
    #[arg(long, default_value_t = 1920)]
    pub width: u32,
    /// Source frame height.
    #[arg(long, default_value_t = 1080)]
    pub height: u32,
    /// Network size (square, letterbox, float32 NCHW, pad 114).
    #[arg(long, default_value_t = 640)]
    pub net: u32,
    /// Timed batches (and N times as many single frames) for the work figure.
    #[arg(long, default_value_t = 300)]
    pub iterations: usize,
    /// Seconds of each back-to-back run and of each latency run.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Camera rate of the latency runs, Hz.
    #[arg(long, default_value_t = 30.0)]
    pub rate: f64,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

fn config(a: &BenchBatchArgs) -> Result<Config> {
    let mut c = Config {
        network_image_width: a.net,
        network_image_height: a.net,
        pad_value: vec![114.0],
        image_mean: vec![0.0],
        image_stddev: vec![1.0],
        ..Config::default()
    };
    c.backend = serde_yaml::from_str(&a.backend).context("--backend: auto, cuda or cpu")?;
    c.validate()?;
    Ok(c)
}

fn frames(a: &BenchBatchArgs) -> Vec<Vec<u8>> {
    let mut rng = vision_preproc::rng::SplitMix64::new(7);
    (0..a.cameras).map(|_| rng.bytes((a.width * a.height * 3) as usize)).collect()
}

fn views<'a>(a: &BenchBatchArgs, frames: &'a [Vec<u8>]) -> Result<Vec<ImageView<'a>>> {
    frames
        .iter()
        .map(|f| Ok(ImageView::new(a.width, a.height, a.width * 3, "bgr8", false, f)?))
        .collect()
}

fn pipeline(cfg: &Config) -> Result<Pipeline> {
    let (backend, _) = select_backend(cfg)?;
    Ok(Pipeline::new(cfg.clone(), backend)?)
}

/// Stage times of one run: [upload, preprocess, conv, download, total] in µs.
type Stages = [f64; 5];

fn stages(t: vision_preproc::backend::StageTimes) -> Stages {
    let v = [t.upload_us, t.preprocess_us, t.conv_us, t.download_us].map(f64::from);
    [v[0], v[1], v[2], v[3], v.iter().sum()]
}

fn run_batch(p: &mut Pipeline, views: &[ImageView<'_>], topics: &[String]) -> Result<Stages> {
    let header = Header::default();
    let inputs: Vec<FrameInput<'_, '_>> = views
        .iter()
        .zip(topics)
        .map(|(v, t)| FrameInput {
            topic: t,
            image: Some(v.into()),
            header: &header,
            source_encoding: "bgr8",
            repeated: false,
        })
        .collect();
    Ok(stages(p.process_frames(&inputs)?.times))
}

fn run_one(p: &mut Pipeline, v: &ImageView<'_>) -> Result<Stages> {
    Ok(stages(p.process(v)?.times))
}

/// p50 of each stage.
fn p50s(runs: &[Stages]) -> Stages {
    let mut out = [0.0; 5];
    for (k, o) in out.iter_mut().enumerate() {
        let v: Vec<f64> = runs.iter().map(|r| r[k]).collect();
        *o = Summary::of(&v).map_or(0.0, |s| s.p50);
    }
    out
}

fn summary(v: &[f64]) -> serde_json::Value {
    match Summary::of(v) {
        Some(s) => serde_json::json!({"p50": s.p50, "p99": s.p99, "mean": s.mean, "n": v.len()}),
        None => serde_json::Value::Null,
    }
}

/// On each camera's own thread and pipeline (N single-camera nodes), `f(pipeline, frame)`
/// after one warm-up frame; the results in camera order.
fn per_camera<T: Send>(
    cfg: &Config,
    views: &[ImageView<'_>],
    f: impl Fn(&mut Pipeline, &ImageView<'_>) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    std::thread::scope(|s| {
        let jobs: Vec<_> = views
            .iter()
            .map(|v| {
                let f = &f;
                s.spawn(move || -> Result<T> {
                    let mut p = pipeline(cfg)?;
                    run_one(&mut p, v)?;
                    f(&mut p, v)
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().map_err(|_| anyhow::anyhow!("a camera thread panicked"))?)
            .collect()
    })
}

/// Calls of `f` per second, back to back for `span`.
fn rate(span: Duration, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < span {
        f()?;
        n += 1;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// `f` once per `period` for `span`: the latency of each call from its tick, ms.
fn paced(span: Duration, period: Duration, mut f: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    let start = Instant::now();
    let mut lat = Vec::new();
    let mut k = 0u32;
    while start.elapsed() < span {
        let tick = start + period * k;
        if let Some(wait) = tick.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        f()?;
        lat.push(tick.elapsed().as_secs_f64() * 1e3);
        k += 1;
    }
    Ok(lat)
}

/// Stage times (p50) of one batch and of one frame, and the batch's sample count.
fn work(
    a: &BenchBatchArgs,
    batched: &mut Pipeline,
    single: &mut Pipeline,
    views: &[ImageView<'_>],
    topics: &[String],
) -> Result<(Stages, Stages, usize)> {
    for _ in 0..a.iterations.min(30) {
        run_batch(batched, views, topics)?;
        run_one(single, &views[0])?;
    }
    let mut work_batch = Vec::new();
    let mut work_one = Vec::new();
    for _ in 0..a.iterations {
        work_batch.push(run_batch(batched, views, topics)?);
        for v in views {
            work_one.push(run_one(single, v)?);
        }
    }
    let (sb, so) = (p50s(&work_batch), p50s(&work_one));
    println!(
        "stage p50 (us) [upload (host staging + H2D), preprocess, conv, download]: batch of {} \
         {:.1} {:.1} {:.1} {:.1}; one frame {:.1} {:.1} {:.1} {:.1}",
        a.cameras, sb[0], sb[1], sb[2], sb[3], so[0], so[1], so[2], so[3]
    );
    // GPU work: the device's own time (events) of the fused kernel and conv2d.
    let (gb, go) = (sb[1] + sb[2], so[1] + so[2]);
    let n = a.cameras as f64;
    println!(
        "GPU work (kernels, events, p50): batch of {} {gb:.1} us vs one frame {go:.1} us: {:.2}x \
         one camera's ({} frames: {:.1} us)",
        a.cameras,
        gb / go,
        a.cameras,
        go * n
    );
    let (wb50, wo50) = (sb[4], so[4]);
    println!(
        "all stages (p50): batch of {} {wb50:.1} us; one frame {wo50:.1} us ({} frames: {:.1} \
         us); batch / one camera = {:.2}x, batch / {} frames = {:.2}x",
        a.cameras,
        a.cameras,
        wo50 * n,
        wb50 / wo50,
        a.cameras,
        wb50 / (wo50 * n)
    );
    Ok((sb, so, work_batch.len()))
}

/// What `run` measured, for its JSON.
struct Figures {
    device: String,
    /// Stage p50s of one batch and of one frame, and the batch's sample count.
    work: (Stages, Stages, usize),
    /// Highest rates, frames/s: batched, separate.
    fps: (f64, f64),
    /// Latencies at the camera rate, ms: batched, separate.
    latency: (Vec<f64>, Vec<f64>),
    pipelined: Option<serde_json::Value>,
}

/// Run `bench-batch`.
pub fn run(a: BenchBatchArgs) -> Result<()> {
    anyhow::ensure!(a.cameras >= 2, "--cameras must be at least 2");
    let cfg = config(&a)?;
    let frames = frames(&a);
    let views = views(&a, &frames)?;
    let topics: Vec<String> = (0..a.cameras).map(|i| format!("/cam{i}/image")).collect();
    let batch_cfg = Config { inputs: topics.clone(), ..cfg.clone() };
    let mut batched = pipeline(&batch_cfg)?;
    let mut single = pipeline(&cfg)?;
    let device = batched.backend().device_description();
    println!(
        "bench-batch: {} cameras {}x{} bgr8 -> {}x3x{}x{} letterbox float32 on {} ({device})",
        a.cameras,
        a.width,
        a.height,
        a.cameras,
        a.net,
        a.net,
        batched.backend().name()
    );

    // 1. Work: stage times of one batch vs one frame (medians; N frames = N x one frame).
    let work = work(&a, &mut batched, &mut single, &views, &topics)?;

    // 2. Highest rate, back to back.
    let fps = highest_rate(&a, &cfg, &mut batched, &views, &topics)?;

    // 2b. The pipelined forms (CUDA): two batches (frames) in flight.
    #[cfg(feature = "cuda")]
    let piped = if batched.backend().name() == "cuda" {
        let span = Duration::from_secs_f64(a.seconds);
        Some(pipelined(&cfg, &views, span, fps.1)?)
    } else {
        None
    };
    #[cfg(not(feature = "cuda"))]
    let piped: Option<serde_json::Value> = None;

    // 3. Latency at the camera rate.
    let latency = latency(&a, &cfg, &mut batched, &views, &topics)?;
    if let Some(path) = &a.json {
        let figures = Figures { device, work, fps, latency, pipelined: piped };
        let doc = json(&a, batched.backend().name(), &figures);
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The highest rates back to back for `--seconds`, frames/s: the batched pipeline on this
/// thread, the N single-camera pipelines on N threads at once (their sum). Printed.
fn highest_rate(
    a: &BenchBatchArgs,
    cfg: &Config,
    batched: &mut Pipeline,
    views: &[ImageView<'_>],
    topics: &[String],
) -> Result<(f64, f64)> {
    let span = Duration::from_secs_f64(a.seconds);
    let batched_fps =
        rate(span, || run_batch(batched, views, topics).map(|_| ()))? * a.cameras as f64;
    let separate_fps: f64 = per_camera(cfg, views, |p, v| {
        for _ in 0..9 {
            run_one(p, v)?;
        }
        rate(span, || run_one(p, v).map(|_| ()))
    })?
    .iter()
    .sum();
    println!(
        "highest rate (back to back, {:.0} s): batched {:.1} frames/s ({:.1} batches/s) vs {} \
         separate pipelines on {} threads {:.1} frames/s: {:.2}x",
        a.seconds,
        batched_fps,
        batched_fps / a.cameras as f64,
        a.cameras,
        a.cameras,
        separate_fps,
        batched_fps / separate_fps
    );
    Ok((batched_fps, separate_fps))
}

/// The latency of each set at `--rate` Hz per camera for `--seconds`, ms: batched, one batch
/// per period; separate, each camera's thread one frame per period. Printed.
fn latency(
    a: &BenchBatchArgs,
    cfg: &Config,
    batched: &mut Pipeline,
    views: &[ImageView<'_>],
    topics: &[String],
) -> Result<(Vec<f64>, Vec<f64>)> {
    let span = Duration::from_secs_f64(a.seconds);
    let period = Duration::from_secs_f64(1.0 / a.rate);
    let lat_batch = paced(span, period, || run_batch(batched, views, topics).map(|_| ()))?;
    let lat_separate: Vec<f64> =
        per_camera(cfg, views, |p, v| paced(span, period, || run_one(p, v).map(|_| ())))?.concat();
    let (lb, ls) = (Summary::of(&lat_batch), Summary::of(&lat_separate));
    println!(
        "latency at {:.0} Hz per camera (tick -> message ready, ms): batched p50 {:.2} p99 {:.2}; \
         separate p50 {:.2} p99 {:.2}",
        a.rate,
        lb.map_or(0.0, |s| s.p50),
        lb.map_or(0.0, |s| s.p99),
        ls.map_or(0.0, |s| s.p50),
        ls.map_or(0.0, |s| s.p99)
    );
    Ok((lat_batch, lat_separate))
}

/// The `--json` document of a run on `backend`.
fn json(a: &BenchBatchArgs, backend: &str, f: &Figures) -> serde_json::Value {
    let ((sb, so, samples), (batched_fps, separate_fps)) = (f.work, f.fps);
    let ((gb, go), (wb50, wo50)) = ((sb[1] + sb[2], so[1] + so[2]), (sb[4], so[4]));
    serde_json::json!({
        "backend": backend,
        "device": f.device,
        "cameras": a.cameras,
        "source": format!("{}x{} bgr8", a.width, a.height),
        "network": format!("{}x3x{}x{} letterbox float32 NCHW", a.cameras, a.net, a.net),
        "stage_p50_us": {"order": ["upload", "preprocess", "conv", "download", "total"],
                         "batch": sb, "one_frame": so},
        "gpu_kernels_p50_us": {"batch": gb, "one_frame": go, "ratio": gb / go},
        "total_p50_us": {"batch": wb50, "one_frame": wo50, "ratio": wb50 / wo50,
                         "samples": samples},
        "highest_rate_fps": {"batched": batched_fps, "separate": separate_fps,
                             "ratio": batched_fps / separate_fps, "seconds": a.seconds},
        "latency_ms": {"rate_hz": a.rate, "batched": summary(&f.latency.0),
                       "separate": summary(&f.latency.1)},
        "pipelined": f.pipelined,
    })
}

/// Each camera's operation, its source set from its frame.
#[cfg(feature = "cuda")]
fn batch_ops(
    cfg: &Config,
    views: &[ImageView<'_>],
) -> Result<Vec<vision_preproc::backend::PreprocessOp>> {
    use vision_preproc::pipeline::{preprocess_op, Geometry};
    views
        .iter()
        .map(|v| {
            let g = Geometry::resolve(cfg, v.width(), v.height())?;
            let mut op = preprocess_op(cfg, &g);
            op.params.set_source(v);
            Ok(op)
        })
        .collect()
}

/// The pipelined figures on the CUDA backend (see the module comment), printed and
/// returned as JSON.
#[cfg(feature = "cuda")]
fn pipelined(
    cfg: &Config,
    views: &[ImageView<'_>],
    span: Duration,
    separate_fps: f64,
) -> Result<serde_json::Value> {
    use vision_preproc::backend::cuda::CudaBackend;
    use vision_preproc::backend::{Backend, BatchSlot, BatchWork, Job};
    let ops = batch_ops(cfg, views)?;
    let slots: Vec<BatchSlot<'_, '_>> =
        views.iter().zip(&ops).map(|(v, op)| BatchSlot::frame(v, op)).collect();
    let n = views.len();
    let item = ops[0].params.tensor_desc().byte_len();
    let h2d: usize = views.iter().map(|v| v.data().len()).sum();
    let d2h = item * n;
    let mut gpu = CudaBackend::new(cfg.device_id, cfg.memory_mode)?;
    let mut times = Vec::new();

    // Batches: two in flight, back to back; the tensors downloaded straight into pinned
    // memory of the backend (one buffer per batch in flight), as the synchronous path
    // writes them into the pinned message.
    let mut outs = [gpu.alloc_host(d2h)?, gpu.alloc_host(d2h)?];
    let job = || Job::Batch(BatchWork::new(&slots, None));
    // Each use: `outs` outlives every submission and a buffer is written again
    // only after its batch was finished (two buffers, two in flight, finished in order).
    let into = |o: &mut vision_preproc::backend::HostBuffer| (o.as_mut_slice().as_mut_ptr(), d2h);
    for _ in 0..10 {
        let (ptr, len) = into(&mut outs[0]);
        // SAFETY: see above (each buffer outlives its submission).
        unsafe { gpu.submit_into(job(), ptr, len) }?;
        gpu.finish_oldest()?;
    }
    let (ptr, len) = into(&mut outs[0]);
    // SAFETY: see above (each buffer outlives its submission).
    unsafe { gpu.submit_into(job(), ptr, len) }?;
    let t = Instant::now();
    let mut batches = 0u64;
    while t.elapsed() < span {
        let (ptr, len) = into(&mut outs[(batches as usize + 1) % 2]);
        // SAFETY: see above (each buffer outlives its submission).
        unsafe { gpu.submit_into(job(), ptr, len) }?;
        let times_k = gpu.finish_oldest()?;
        let tensors = outs[batches as usize % 2].as_slice();
        // alloc_host gives at least d2h bytes (pinned buffers are rounded up).
        anyhow::ensure!(tensors.len() >= d2h, "the batch's buffer has {} bytes", tensors.len());
        times.push(times_k);
        batches += 1;
    }
    let elapsed = t.elapsed().as_secs_f64();
    gpu.finish_oldest()?;
    // The roof: the PCIe link, measured here with one copy of the batch's bytes each
    // way; batching moves the same bytes as N pipelines, so it bounds both sides.
    let (link_up, link_down) = gpu.link_rates(h2d, d2h)?;
    let p = Piped {
        batch_fps: batches as f64 * n as f64 / elapsed,
        n: n as f64,
        stages: stage_p50s(&times),
        bytes: (h2d, d2h),
        link: (link_up, link_down),
    };
    p.print(separate_fps);

    // One camera: synchronous (submit, finish) vs two frames in flight.
    let one_sync = one_camera(false, &mut gpu, views, &ops, span)?;
    let one_piped = one_camera(true, &mut gpu, views, &ops, span)?;
    println!(
        "one camera: synchronous {one_sync:.1} frames/s, two frames in flight {one_piped:.1} \
         frames/s: {:.2}x",
        one_piped / one_sync
    );
    Ok(p.json(separate_fps, one_sync, one_piped))
}

/// The pipelined batch's figures.
#[cfg(feature = "cuda")]
struct Piped {
    /// Frames per second (batches x N).
    batch_fps: f64,
    /// Cameras.
    n: f64,
    /// p50 of the upload, preprocess, conv and download stages, µs.
    stages: [f64; 4],
    /// Bytes per batch: H2D, D2H.
    bytes: (usize, usize),
    /// The PCIe link's rates measured now, GB/s: H2D, D2H.
    link: (f64, f64),
}

#[cfg(feature = "cuda")]
impl Piped {
    /// The rate the PCIe link allows for these bytes, frames/s.
    fn roof_fps(&self) -> f64 {
        let ((h2d, d2h), (up, down)) = (self.bytes, self.link);
        (up * 1e9 / h2d as f64).min(down * 1e9 / d2h as f64) * self.n
    }

    fn print(&self, separate_fps: f64) {
        let (batch_fps, n, [up, pre, conv, down]) = (self.batch_fps, self.n, self.stages);
        let ((h2d, d2h), (link_up, link_down)) = (self.bytes, self.link);
        let roof_fps = self.roof_fps();
        println!(
            "pipelined batch (2 in flight, copy stream): {:.1} frames/s ({:.1} batches/s, {:.2}x the \
             separate pipelines); stage \
             p50 (us) upload (host staging + H2D) {up:.1}, preprocess {pre:.1}, conv {conv:.1}, \
             download {down:.1}; bytes per batch H2D {h2d}, D2H {d2h}: {:.1} and {:.1} GB/s at \
             this rate; PCIe link measured now {link_up:.1} GB/s H2D, {link_down:.1} GB/s D2H: \
             at most {roof_fps:.1} frames/s for these bytes ({:.2}x the separate pipelines)",
            batch_fps,
            batch_fps / n,
            batch_fps / separate_fps,
            batch_fps / n * h2d as f64 / 1e9,
            batch_fps / n * d2h as f64 / 1e9,
            roof_fps / separate_fps,
        );
    }

    fn json(&self, separate_fps: f64, one_sync: f64, one_piped: f64) -> serde_json::Value {
        let [up, pre, conv, down] = self.stages;
        serde_json::json!({
            "batch_fps": self.batch_fps,
            "ratio_to_separate": self.batch_fps / separate_fps,
            "stage_p50_us": {"upload": up, "preprocess": pre, "conv": conv, "download": down},
            "bytes_per_batch": {"h2d": self.bytes.0, "d2h": self.bytes.1},
            "pcie_link_gb_s": {"h2d": self.link.0, "d2h": self.link.1},
            "roof_fps": self.roof_fps(),
            "one_camera_fps": {"synchronous": one_sync, "two_in_flight": one_piped},
        })
    }
}

/// p50 of the upload, preprocess, conv and download stages of `times`, µs.
#[cfg(feature = "cuda")]
fn stage_p50s(times: &[vision_preproc::backend::StageTimes]) -> [f64; 4] {
    let med = |f: &dyn Fn(&vision_preproc::backend::StageTimes) -> f32| -> f64 {
        let v: Vec<f64> = times.iter().map(|t| f64::from(f(t))).collect();
        Summary::of(&v).map_or(0.0, |s| s.p50)
    };
    [med(&|t| t.upload_us), med(&|t| t.preprocess_us), med(&|t| t.conv_us), med(&|t| t.download_us)]
}

/// One camera (`views[0]`) back to back for `span` on `gpu`: synchronous (submit, finish)
/// or pipelined (two frames in flight), frames/s; each tensor copied out into (pageable)
/// host memory at the finish.
#[cfg(feature = "cuda")]
fn one_camera(
    piped: bool,
    gpu: &mut vision_preproc::backend::cuda::CudaBackend,
    views: &[ImageView<'_>],
    ops: &[vision_preproc::backend::PreprocessOp],
    span: Duration,
) -> Result<f64> {
    use vision_preproc::backend::{Backend, FrameWork, Job};
    let item = ops[0].params.tensor_desc().byte_len();
    let mut tensors = [vec![0u8; item], vec![0u8; item]];
    let job = || Job::Frame(FrameWork::new(&views[0], &ops[0], None));
    // Each use: `tensors` outlives every submission, and a tensor is written
    // again only after its frame was finished (two tensors, two in flight, in order).
    for _ in 0..10 {
        // SAFETY: see above (each buffer outlives its submission).
        unsafe { gpu.submit_into(job(), tensors[0].as_mut_ptr(), item) }?;
        gpu.finish_oldest()?;
    }
    let t = Instant::now();
    let mut frames = 0usize;
    let mut pending = false;
    while t.elapsed() < span {
        let out = &mut tensors[frames % 2];
        // SAFETY: see above (each buffer outlives its submission).
        unsafe { gpu.submit_into(job(), out.as_mut_ptr(), item) }?;
        if !piped || std::mem::replace(&mut pending, true) {
            gpu.finish_oldest()?;
        }
        frames += 1;
    }
    if pending {
        gpu.finish_oldest()?;
    }
    Ok(frames as f64 / t.elapsed().as_secs_f64())
}
