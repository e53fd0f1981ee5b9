//! `vision_preproc bench --startup`: what it costs to start the CUDA backend.

use super::timing::drv;
use std::time::Instant;
use vision_preproc::backend::cuda::CudaBackend;
use vision_preproc::backend::{Backend, FrameWork, PreprocessOp};
use vision_preproc::config::{Config, MemoryMode};
use vision_preproc::error::{CudaError, Result};
use vision_preproc::pipeline::{preprocess_op, Geometry};
use vision_preproc::rng::SplitMix64;
use vision_preproc::{Encoding, ImageView};

/// Resident and peak resident set of this process, kB (`/proc/self/status`; 0 elsewhere).
fn rss_kb() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Device memory in use on the whole device (total - free), bytes, as `cuMemGetInfo`
/// reports it from the current context.
fn device_used() -> Result<u64, CudaError> {
    let (free, total) =
        cudarc::driver::result::mem_get_info().map_err(|e| drv("cuMemGetInfo", e))?;
    Ok(total.saturating_sub(free) as u64)
}

/// Start-up cost: create the CUDA context (timed on its own), open the backend (kernels
/// from `cache_dir`, compiled and stored there when missing) and process one `width` x
/// `height` rgb8 frame with the default configuration (640x480 letterbox NCHW float32).
/// Returns the breakdown as JSON: milliseconds of each step, whether every module came
/// from the cache, the process's RSS and the device memory in use after each step (and
/// after 100 more frames, the steady state; `since_first_tensor_ms`: from the first tensor
/// to this report, for a caller timing the process from outside). `on_ready` is called
/// with that report while the backend and its CUDA context are still open.
pub fn startup(
    device_id: u32,
    cache_dir: Option<&std::path::Path>,
    (w, h): (u32, u32),
    on_ready: &mut dyn FnMut(&serde_json::Value),
) -> Result<serde_json::Value> {
    let t0 = Instant::now();
    cudarc::driver::result::init().map_err(|e| CudaError::Unavailable(format!("cuInit: {e:?}")))?;
    // The primary context, kept alive: the backend retains the same one below.
    let ctx = cudarc::driver::CudaContext::new(device_id as usize)
        .map_err(|e| drv(format!("creating the context of device {device_id}"), e))?;
    let context_ms = t0.elapsed().as_secs_f64() * 1e3;
    ctx.bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))?;
    let used_ctx = device_used()?;
    let t1 = Instant::now();
    let mut b = CudaBackend::new_with_cache(device_id, MemoryMode::Auto, cache_dir)?;
    let open_ms = t1.elapsed().as_secs_f64() * 1e3;
    ctx.bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))?;
    let used_open = device_used()?;
    let frame = SplitMix64::new(3).bytes((w * h * 3) as usize);
    let view = ImageView::with_encoding(w, h, w * 3, Encoding::Rgb8, false, &frame)?;
    let op = default_op(w, h)?;
    let mut out = Vec::new();
    let t2 = Instant::now();
    b.process(FrameWork::new(&view, &op, None), &mut out)?;
    let frame_ms = t2.elapsed().as_secs_f64() * 1e3;
    let first_tensor_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t_first = Instant::now();
    ctx.bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))?;
    let used_frame = device_used()?;
    let (rss, hwm) = rss_kb();
    // Steady state: 100 more frames of the same size.
    let (used_steady, (rss_steady, hwm_steady)) = steady_state(&mut b, &ctx, &view, &op)?;
    let (kernels, cached, embedded) = kernel_loads(&b);
    let mut report = serde_json::json!({
        "frame": format!("{w}x{h} rgb8 -> 640x480 letterbox NCHW float32"),
        "context_ms": context_ms,
        "open_ms": open_ms,
        "kernels": kernels,
        "cached": cached,
        "embedded": embedded,
        "first_frame_ms": frame_ms,
        "context_to_first_tensor_ms": first_tensor_ms,
        "rss_kb": rss,
        "rss_peak_kb": hwm,
        "rss_kb_after_100_frames": rss_steady,
        "rss_peak_kb_after_100_frames": hwm_steady,
        "device_used_bytes": {
            "after_context": used_ctx, "after_open": used_open,
            "after_first_frame": used_frame, "after_100_frames": used_steady,
        },
    });
    report["since_first_tensor_ms"] = serde_json::json!(t_first.elapsed().as_secs_f64() * 1e3);
    // The backend and its context are still alive here (they are dropped on return).
    on_ready(&report);
    Ok(report)
}

/// 100 more frames of `view` through `op` on `b`, then the device memory in use and the
/// process's resident and peak resident set, as [`startup`] reports them.
fn steady_state(
    b: &mut CudaBackend,
    ctx: &cudarc::driver::CudaContext,
    view: &ImageView<'_>,
    op: &PreprocessOp,
) -> Result<(u64, (u64, u64))> {
    let mut out = Vec::new();
    for _ in 0..100 {
        b.process(FrameWork::new(view, op, None), &mut out)?;
    }
    ctx.bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))?;
    Ok((device_used()?, rss_kb()))
}

/// The default configuration's operation for a `w` x `h` rgb8 frame.
fn default_op(w: u32, h: u32) -> Result<PreprocessOp> {
    let cfg = Config::default();
    let g = Geometry::resolve(&cfg, w, h)?;
    let mut op = preprocess_op(&cfg, &g);
    op.params.src_step = w * 3;
    op.params.encoding = Encoding::Rgb8 as u32;
    Ok(op)
}

/// Where the backend's kernel modules came from: one object per module, whether all came
/// from the cache, whether all were the embedded CUBINs.
fn kernel_loads(b: &CudaBackend) -> (Vec<serde_json::Value>, bool, bool) {
    use vision_preproc::backend::cuda::kernels::Origin;
    let loads = b.load_reports();
    let kernels = loads
        .iter()
        .map(|l| {
            serde_json::json!({
                "file": l.file, "origin": l.origin.name(), "compile_ms": l.compile_ms,
                "why_not_embedded": l.why_not_embedded,
            })
        })
        .collect();
    let cached = loads.iter().all(|l| l.origin == Origin::Cache);
    let embedded = loads.iter().all(|l| l.origin == Origin::EmbeddedCubin);
    (kernels, cached, embedded)
}
