//! Hardware-decoded video read in place on the device (`capture/cuda.rs`, the CUDA
//! backend's `Frame::Device`): H.264 and H.265 clips decoded by GStreamer's `nvh264dec` /
//! `nvh265dec` in the CUDA backend's own context (`capture::GpuShare`), each frame's NV12
//! in CUDA memory given to the backend as it is, in both memory modes:
//!
//! - every frame comes in CUDA memory (the appsink prefers it), and its decoded NV12,
//!   downloaded here for the check only, equals the oracle's EXACTLY: the SHA-256
//!   of the frame's tight NV12 (Y rows, then the interleaved chroma rows, `width` bytes
//!   each) that PyAV (FFmpeg's libavcodec, an independent decoder) computed on the build
//!   machine (`scripts/device/make_video_clips.py`); H.264/H.265 decoding is bit-exact by
//!   specification; the clip's frame count too;
//! - the CUDA backend's tensor of the frame read in place equals the CPU backend's tensor
//!   of the same NV12 on the host (the CPU decoder's frame: the same bytes, by the hash)
//!   within `float32_abs` (test/tolerances.json), for two operations (640x480 letterbox
//!   NCHW float32; 640x640 stretch NHWC float16 within `float16_rel`/`float16_abs`) and a
//!   batch of the device frame beside a host frame in one launch;
//! - the ledger: every frame counted read on the device (`LentReads::on_device`), none
//!   registered in place or staged (no upload, no host copy of a frame).
//!
//! `--clips DIR` (clips.json and the clips, from make_video_clips.py), `--quick` (the first
//! 4 frames of each clip, upload mode only: under compute-sanitizer). A `harness = false`
//! target: without a GPU (or without the nvcodec decoders) it prints "no GPU: GPU tests
//! NOT run (not counted as passed)" and exits 0; on a GPU it exits 1 if anything differs.

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vision_preproc::backend::cpu::CpuBackend;
use vision_preproc::backend::cuda::CudaBackend;
use vision_preproc::backend::{Backend, BatchSlot, BatchWork, Frame, FrameWork, PreprocessOp};
use vision_preproc::capture::{CaptureSource, GpuShare};
use vision_preproc::config::{DType, Layout, MemoryMode, ResizeMode};
use vision_preproc::image::LentReads;
use vision_preproc::pipeline::{preprocess_op, Geometry};
use vision_preproc::{CaptureError, Config, DeviceView, Encoding, Error, ImageView};

const TOLERANCES: &str = include_str!("tolerances.json");

/// One clip of clips.json.
#[derive(serde::Deserialize)]
struct Clip {
    name: String,
    file: String,
    codec: String,
    width: u32,
    height: u32,
    /// SHA-256 of each decoded frame's tight NV12, in output order, as hex.
    frames: Vec<String>,
}

fn gpu_present() -> bool {
    // SAFETY: only tries to dlopen libcuda.
    let lib = unsafe { cudarc::driver::sys::is_culib_present() };
    lib && cudarc::driver::result::init().is_ok()
        && cudarc::driver::result::device::get_count().is_ok_and(|n| n > 0)
}

/// The frame's bytes (`len`: its rows at its step) copied to the host: the check's own
/// download, not the backend's.
fn download(d: &DeviceView<'_>) -> Vec<u8> {
    let mut host = vec![0u8; d.len()];
    // SAFETY: `host` has `d.len()` bytes; the device memory holds at least as many (the
    // view's check) and stays mapped while `d` lives; the context is current.
    let r = unsafe {
        cudarc::driver::sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), d.memory().ptr(), d.len())
    };
    assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS, "download");
    host
}

/// The SHA-256 (hex) of a frame's tight NV12 (`width` bytes of each of its `height * 3 /
/// 2` rows at `step`): the oracle's hash (scripts/device/make_video_clips.py, hashlib).
fn nv12_hash(host: &[u8], width: u32, height: u32, step: u32) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for r in 0..(height * 3 / 2) as usize {
        h.update(&host[r * step as usize..r * step as usize + width as usize]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The two operations of every frame: 640x480 letterbox NCHW float32 (the default), and
/// 640x640 stretch NHWC float16.
fn ops(frame: Frame<'_, '_>) -> Vec<(PreprocessOp, DType)> {
    let configs = [
        Config::default(),
        Config {
            network_image_width: 640,
            network_image_height: 640,
            resize_mode: ResizeMode::Stretch,
            output_layout: Layout::Nhwc,
            output_dtype: DType::Float16,
            ..Config::default()
        },
    ];
    configs
        .iter()
        .map(|cfg| {
            let g = Geometry::resolve(cfg, frame.width(), frame.height()).expect("geometry");
            let mut op = preprocess_op(cfg, &g);
            op.params.set_source(frame);
            (op, cfg.output_dtype)
        })
        .collect()
}

/// The largest |a - b| over a tensor's elements, and whether every element is within
/// tolerance (float32: `f32_abs`; float16: `f16_rel * |b| + f16_abs`).
fn compare(a: &[u8], b: &[u8], dtype: DType, tol: &serde_json::Value) -> (f64, bool) {
    let g = |k: &str| tol[k].as_f64().expect("tolerance");
    let values = |x: &[u8]| -> Vec<f64> {
        match dtype {
            DType::Float16 => x
                .chunks_exact(2)
                .map(|c| f64::from(half::f16::from_le_bytes([c[0], c[1]]).to_f32()))
                .collect(),
            _ => x
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        }
    };
    let (va, vb) = (values(a), values(b));
    let mut worst = 0.0f64;
    let mut ok = va.len() == vb.len();
    for (x, y) in va.iter().zip(&vb) {
        let d = (x - y).abs();
        worst = worst.max(if d.is_nan() { f64::INFINITY } else { d });
        let bound = match dtype {
            DType::Float16 => g("float16_rel") * y.abs() + g("float16_abs"),
            _ => g("float32_abs"),
        };
        ok &= d <= bound;
    }
    (worst, ok)
}

/// Poisoned output of `len` bytes (NaN in float32 and float16 alike).
fn poisoned(len: usize) -> Vec<u8> {
    vec![0xFF; len]
}

/// What one clip's run found.
#[derive(Default)]
struct Run {
    frames: usize,
    hash_mismatch: Vec<usize>,
    worst: f64,
    failures: Vec<String>,
}

/// The checks of one frame in device memory `d` (number `i` of `clip`).
fn check_frame(
    d: &DeviceView<'_>,
    i: usize,
    clip: &Clip,
    (gpu, cpu): (&mut CudaBackend, &mut CpuBackend),
    tol: &serde_json::Value,
    run: &mut Run,
) {
    let host = download(d);
    let hash = nv12_hash(&host, d.width(), d.height(), d.step());
    if clip.frames.get(i) != Some(&hash) {
        run.hash_mismatch.push(i);
    }
    let view =
        ImageView::with_encoding(d.width(), d.height(), d.step(), Encoding::Nv12, false, &host)
            .expect("host view");
    for (k, (op, dtype)) in ops(Frame::Device(d)).into_iter().enumerate() {
        let len = op.params.tensor_desc().byte_len();
        let (mut a, mut b) = (poisoned(len), poisoned(len));
        let ra = gpu.process_into(FrameWork::new(d, &op, None), &mut a);
        let rb = cpu.process_into(FrameWork::new(&view, &op, None), &mut b);
        if let Err(e) = ra.as_ref().and(rb.as_ref()) {
            run.failures.push(format!("{} frame {i} op {k}: {e}", clip.name));
            continue;
        }
        let (worst, ok) = compare(&a, &b, dtype, tol);
        run.worst = run.worst.max(worst);
        if !ok {
            run.failures
                .push(format!("{} frame {i} op {k}: max |cuda - cpu| {worst:e}", clip.name));
        }
        // A batch: the device frame beside the same pixels from the host, one launch.
        let slots = [
            BatchSlot { image: Some(Frame::Device(d)), op: &op },
            BatchSlot { image: Some(Frame::Pixels(&view)), op: &op },
        ];
        let mut batch = poisoned(2 * len);
        match gpu.process_batch_into(BatchWork::new(&slots, None), &mut batch) {
            Ok(_) => {
                for (s, item) in batch.chunks(len).enumerate() {
                    let (w, ok) = compare(item, &b, dtype, tol);
                    if !ok {
                        run.failures.push(format!(
                            "{} frame {i} op {k} batch slot {s}: max |cuda - cpu| {w:e}",
                            clip.name
                        ));
                    }
                }
            }
            Err(e) => run.failures.push(format!("{} frame {i} op {k} batch: {e}", clip.name)),
        }
    }
}

/// One clip through the hardware decoder into `gpu` (memory mode `mode`); `limit` frames
/// at most.
fn run_clip(
    dir: &str,
    clip: &Clip,
    mode: MemoryMode,
    limit: usize,
    tol: &serde_json::Value,
) -> Run {
    let mut run = Run::default();
    let mut gpu = CudaBackend::new(0, mode).expect("CUDA backend");
    let mut cpu = CpuBackend::new();
    let share = match gpu.device_context().map(GpuShare::new) {
        Some(Ok(s)) => s,
        other => {
            let why = other.map(|r| r.err().unwrap_or_default()).unwrap_or_default();
            run.failures.push(format!("{}: no GpuShare: {why}", clip.name));
            return run;
        }
    };
    let (parse, dec) = match clip.codec.as_str() {
        "h265" => ("h265parse", "nvh265dec"),
        _ => ("h264parse", "nvh264dec"),
    };
    // The first clip names the caps as a user's `gst:` line would; the others rely on the
    // appsink preferring CUDA memory.
    let caps = if clip.name.contains("caps") { " ! video/x-raw(memory:CUDAMemory)" } else { "" };
    let description = format!("filesrc location={dir}/{} ! {parse} ! {dec}{caps}", clip.file);
    let reads = Arc::new(LentReads::default());
    let mut source = match CaptureSource::start_on(&description, Some(share)) {
        Ok(s) => s,
        Err(e) => {
            run.failures.push(format!("{}: {e}", clip.name));
            return run;
        }
    };
    source.count_reads_in(reads.clone());
    while run.frames < limit {
        let frame = match source.next(std::time::Duration::from_secs(10)) {
            Ok(Some(f)) => f,
            Ok(None) => {
                run.failures.push(format!("{}: no frame within 10 s", clip.name));
                break;
            }
            Err(Error::Capture { fault: CaptureError::EndOfStream, .. }) => break,
            Err(e) => {
                run.failures.push(format!("{}: {e}", clip.name));
                break;
            }
        };
        let Some(d) = frame.device() else {
            run.failures.push(format!(
                "{} frame {}: in system memory, not CUDA memory",
                clip.name, run.frames
            ));
            break;
        };
        if (d.width(), d.height()) != (clip.width, clip.height) {
            run.failures.push(format!("{}: {}x{} decoded", clip.name, d.width(), d.height()));
        }
        check_frame(&d, run.frames, clip, (&mut gpu, &mut cpu), tol, &mut run);
        run.frames += 1;
    }
    let _ = source.stop();
    let expected = clip.frames.len().min(limit);
    if run.frames != expected {
        run.failures
            .push(format!("{}: {} frames decoded, {expected} expected", clip.name, run.frames));
    }
    let (dev, in_place, staged) = (
        reads.on_device.load(Ordering::Relaxed),
        reads.in_place.load(Ordering::Relaxed),
        reads.staged.load(Ordering::Relaxed),
    );
    println!(
        "  ledger: {dev} frames read on the device, {in_place} registered in place, {staged} \
         staged (host copies)"
    );
    if dev != run.frames as u64 || in_place != 0 || staged != 0 {
        run.failures.push(format!("{}: ledger {dev}/{in_place}/{staged}", clip.name));
    }
    run
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let arg =
        |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let Some(dir) = arg("--clips") else {
        println!("no GPU: GPU tests NOT run (not counted as passed): no --clips DIR");
        return ExitCode::SUCCESS;
    };
    if !gpu_present() {
        println!("no GPU: GPU tests NOT run (not counted as passed)");
        return ExitCode::SUCCESS;
    }
    let clips: Vec<Clip> = serde_json::from_str(
        &std::fs::read_to_string(format!("{dir}/clips.json")).expect("clips.json"),
    )
    .expect("clips.json parses");
    let tol: serde_json::Value = serde_json::from_str(TOLERANCES).expect("tolerances.json");
    let (modes, limit) = if quick {
        (vec![MemoryMode::Upload], 4)
    } else {
        (vec![MemoryMode::Upload, MemoryMode::Mapped], usize::MAX)
    };
    let mut failures = Vec::new();
    for clip in &clips {
        for &mode in &modes {
            println!(
                "{} ({} {}x{}, {} frames), memory mode {mode:?}:",
                clip.name,
                clip.codec,
                clip.width,
                clip.height,
                clip.frames.len()
            );
            let run = run_clip(&dir, clip, mode, limit, &tol);
            println!(
                "  {} frames; decoded NV12 equal to PyAV's: {} of {}; max |cuda - cpu| {:e}",
                run.frames,
                run.frames - run.hash_mismatch.len(),
                run.frames,
                run.worst
            );
            if !run.hash_mismatch.is_empty() {
                failures.push(format!(
                    "{} {mode:?}: NV12 differs at frames {:?}",
                    clip.name, run.hash_mismatch
                ));
            }
            failures.extend(run.failures);
        }
    }
    println!("gpu_video summary: {} clips, {} failures", clips.len(), failures.len());
    for f in &failures {
        println!("FAIL {f}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
