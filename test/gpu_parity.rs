//! GPU parity: the CUDA backend against the CPU backend (the specification) over the
//! whole matrix: every encoding, resize mode, interpolation, layout, dtype, channel
//! count and order, ROI, awkward and padded sizes, conv2d sizes and borders, both memory
//! modes; edge cases at the bounds (minimum sizes, ROI on the last pixel, conv2d 15x15
//! on images smaller than the kernel: `--filter edge`); on fresh random inputs (new seed each run, printed) AND the photographs in
//! test/data/, through three CUDA backends: upload + direct fused path, mapped + direct,
//! upload + staged (shared-memory window) path. Every output buffer of the CUDA backend is
//! poisoned with NaN before each frame, so an element the kernels do not write fails.
//! Tolerances come from test/tolerances.json (conv2d: conv_float32_abs_per_l1 scaled by
//! the kernel's sum|w|, docs/SPEC_conv2d.md).
//!
//! A `harness = false` target: on a machine without a GPU it prints
//! "no GPU: GPU tests NOT run (not counted as passed)" and exits 0. On a GPU it exits 1 if
//! any case differs OR could not be compared. Run under compute-sanitizer by
//! scripts/device/gpu_backend_remote.sh. Every check is a named case (`cases`), run on each
//! of the three backends (its name starts with `[Upload Direct]`, `[Mapped Direct]` or
//! `[Upload Staged]`). Options: `--list` prints the case names (no GPU needed), `--filter
//! TEXT` runs only the cases whose name contains TEXT (only that case when TEXT is a whole
//! name), `--stride N` every Nth matrix case (for the slow racecheck run). A failure
//! prints its case's name and the command that reruns it alone; each case draws its
//! random inputs from the seed and its name, so that command reproduces them.

use std::process::ExitCode;
use std::time::Instant;
use vision_preproc::backend::cpu::CpuBackend;
use vision_preproc::backend::cuda::{CudaBackend, FusedPath};
use vision_preproc::backend::{
    read_elements, Backend, BatchSlot, BatchWork, Conv2dOp, FrameWork, Job, Out, PreprocessOp,
    Queued,
};
use vision_preproc::config::{
    Border, ChannelOrder, ConvConfig, ConvKernel, DType, Interpolation, Layout, LetterboxAnchor,
    MemoryMode, ResizeMode,
};
// splitmix64, for fresh random frames.
use vision_preproc::pipeline::{conv_op, preprocess_op, Geometry};
use vision_preproc::rng::SplitMix64 as Rng;
use vision_preproc::{Config, Encoding, ImageView};

const TOLERANCES: &str = include_str!("tolerances.json");
#[path = "common/photos.rs"]
mod photos;
use photos::PHOTOS;

struct Tol {
    f32_abs: f64,
    f16_rel: f64,
    f16_abs: f64,
    /// conv2d outputs: `conv_per_l1 * max(1, sum|w|)` absolute (docs/SPEC_conv2d.md).
    conv_per_l1: f64,
}

fn tolerances() -> Tol {
    let v: serde_json::Value = serde_json::from_str(TOLERANCES).expect("test/tolerances.json");
    let g = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("tolerances.json: {k} missing"));
    Tol {
        f32_abs: g("float32_abs"),
        f16_rel: g("float16_rel"),
        f16_abs: g("float16_abs"),
        conv_per_l1: g("conv_float32_abs_per_l1"),
    }
}

/// An owned frame.
struct Frame {
    w: u32,
    h: u32,
    step: u32,
    enc: Encoding,
    big_endian: bool,
    data: Vec<u8>,
}

impl Frame {
    fn view(&self) -> ImageView<'_> {
        ImageView::with_encoding(self.w, self.h, self.step, self.enc, self.big_endian, &self.data)
            .expect("test frame must be valid")
    }
}

fn rows_of(enc: Encoding, h: u32) -> u32 {
    if matches!(enc, Encoding::Nv12 | Encoding::Nv21) {
        h * 3 / 2
    } else {
        h
    }
}

/// Sizes the encoding accepts (4:2:2 even width, 4:2:0 even both).
fn legal_size(enc: Encoding, w: u32, h: u32) -> (u32, u32) {
    match enc {
        Encoding::Yuyv | Encoding::Uyvy => (w.next_multiple_of(2), h),
        Encoding::Nv12 | Encoding::Nv21 => (w.next_multiple_of(2), h.next_multiple_of(2)),
        _ => (w, h),
    }
}

fn random_frame(rng: &mut Rng, enc: Encoding, w: u32, h: u32, pad: u32, big_endian: bool) -> Frame {
    let (w, h) = legal_size(enc, w, h);
    let step = w * enc.bytes_per_pixel() + pad;
    let n = (step * rows_of(enc, h)) as usize;
    let data = (0..n).map(|_| rng.byte()).collect();
    Frame { w, h, step, enc, big_endian, data }
}

/// Encode an RGB8 photograph (w x h, dense) into `enc` (any reasonable encoder: the test
/// compares two decoders of the same bytes).
fn photo_frame(rgb: &[u8], pw: u32, ph: u32, enc: Encoding, rng: &mut Rng) -> Frame {
    let (w, h) = (pw & !1, ph & !1); // every encoding accepts even sizes
    let px = |x: u32, y: u32| {
        let i = ((y * pw + x) * 3) as usize;
        [rgb[i], rgb[i + 1], rgb[i + 2]]
    };
    let luma = |p: [u8; 3]| {
        ((299 * u32::from(p[0]) + 587 * u32::from(p[1]) + 114 * u32::from(p[2])) / 1000) as u8
    };
    let bpp = enc.bytes_per_pixel();
    let step = w * bpp;
    let mut data = vec![0u8; (step * rows_of(enc, h)) as usize];
    let yuv = |p: [u8; 3]| {
        let (r, g, b) = (f64::from(p[0]), f64::from(p[1]), f64::from(p[2]));
        let y = 16.0 + 0.257 * r + 0.504 * g + 0.098 * b;
        let u = 128.0 - 0.148 * r - 0.291 * g + 0.439 * b;
        let v = 128.0 + 0.439 * r - 0.368 * g - 0.071 * b;
        [y.round() as u8, u.round() as u8, v.round() as u8]
    };
    for y in 0..h {
        for x in 0..w {
            let p = px(x, y);
            let o = (y * step + x * bpp) as usize;
            match enc {
                Encoding::Rgb8 => data[o..o + 3].copy_from_slice(&p),
                Encoding::Bgr8 => data[o..o + 3].copy_from_slice(&[p[2], p[1], p[0]]),
                Encoding::Rgba8 => data[o..o + 4].copy_from_slice(&[p[0], p[1], p[2], rng.byte()]),
                Encoding::Bgra8 => data[o..o + 4].copy_from_slice(&[p[2], p[1], p[0], rng.byte()]),
                Encoding::Mono8 => data[o] = luma(p),
                Encoding::Mono16 => {
                    let v = u16::from(luma(p)) * 257 + rng.below(257) as u16;
                    data[o..o + 2].copy_from_slice(&v.to_le_bytes());
                }
                Encoding::Rgb16 | Encoding::Bgr16 => {
                    let c = if enc == Encoding::Rgb16 { p } else { [p[2], p[1], p[0]] };
                    for k in 0..3 {
                        let v = u16::from(c[k]) * 257 + rng.below(257) as u16;
                        data[o + 2 * k..o + 2 * k + 2].copy_from_slice(&v.to_le_bytes());
                    }
                }
                Encoding::Yuyv | Encoding::Uyvy => {
                    let q = yuv(p);
                    let pair = (y * step + (x & !1) * 2) as usize;
                    let (yi, ui, vi) = if enc == Encoding::Yuyv {
                        ((x & 1) as usize * 2, 1, 3)
                    } else {
                        ((x & 1) as usize * 2 + 1, 0, 2)
                    };
                    data[pair + yi] = q[0];
                    if x & 1 == 0 {
                        data[pair + ui] = q[1];
                        data[pair + vi] = q[2];
                    }
                }
                Encoding::Nv12 | Encoding::Nv21 => {
                    let q = yuv(p);
                    data[o] = q[0];
                    if x & 1 == 0 && y & 1 == 0 {
                        let c = ((h + y / 2) * step + x) as usize;
                        let (u, v) =
                            if enc == Encoding::Nv12 { (q[1], q[2]) } else { (q[2], q[1]) };
                        data[c] = u;
                        data[c + 1] = v;
                    }
                }
                Encoding::BayerRggb8
                | Encoding::BayerBggr8
                | Encoding::BayerGbrg8
                | Encoding::BayerGrbg8 => {
                    let pattern: [usize; 4] = match enc {
                        Encoding::BayerRggb8 => [0, 1, 1, 2],
                        Encoding::BayerBggr8 => [2, 1, 1, 0],
                        Encoding::BayerGbrg8 => [1, 2, 0, 1],
                        _ => [1, 0, 2, 1],
                    };
                    data[o] = p[pattern[((y & 1) * 2 + (x & 1)) as usize]];
                }
            }
        }
    }
    Frame { w, h, step, enc, big_endian: false, data }
}

#[derive(Default)]
struct Stats {
    passed: usize,
    failed: usize,
    not_compared: usize,
    staged: usize,
    max_f32: f64,
    max_f16: f64,
    not_compared_kinds: std::collections::BTreeMap<String, usize>,
}

/// A passed case.
struct Outcome {
    max_diff: f64,
    staged: bool,
}

fn values(bytes: &[u8], dtype: DType) -> Vec<f64> {
    read_elements(dtype, bytes).into_iter().map(f64::from).collect()
}

fn build_op(cfg: &Config, frame: &Frame) -> Result<PreprocessOp, String> {
    let g = Geometry::resolve(cfg, frame.w, frame.h).map_err(|e| e.to_string())?;
    let mut op = preprocess_op(cfg, &g);
    op.params.src_step = frame.step;
    op.params.encoding = frame.enc as u32;
    op.params.big_endian = u32::from(frame.big_endian);
    Ok(op)
}

/// The expected tensor (f64 values in the output layout): the CPU backend's.
fn expected(
    cpu: &mut CpuBackend,
    frame: &Frame,
    cfg: &Config,
    conv: Option<&Conv2dOp>,
) -> Result<Vec<f64>, String> {
    let op = build_op(cfg, frame)?;
    let mut out = Vec::new();
    cpu.process(FrameWork::new(&frame.view(), &op, conv), &mut out)
        .map_err(|e| format!("CPU backend: {e}"))?;
    Ok(values(&out, cfg.output_dtype))
}

/// Compare within the named tolerances; `conv_l1` is `sum|w|` of the conv2d applied, if any.
fn compare(
    actual: &[u8],
    expect: &[f64],
    dtype: DType,
    tol: &Tol,
    conv_l1: Option<f64>,
) -> Result<f64, String> {
    let a = values(actual, dtype);
    if a.len() != expect.len() {
        return Err(format!("tensor has {} elements, expected {}", a.len(), expect.len()));
    }
    let mut max = 0.0f64;
    let mut bad = 0usize;
    let mut first = None;
    for (i, (&x, &e)) in a.iter().zip(expect).enumerate() {
        let abs = match conv_l1 {
            Some(l1) => tol.conv_per_l1 * l1.max(1.0),
            None if dtype == DType::Float32 => tol.f32_abs,
            None => tol.f16_abs,
        };
        let t = match dtype {
            DType::Float32 => abs,
            DType::Float16 => tol.f16_rel * e.abs() + abs,
        };
        // float16 overflow: both backends round the same huge value to the same infinity.
        let d = if x == e { 0.0 } else { (x - e).abs() };
        if x.is_nan() || d.is_nan() || d > t {
            bad += 1;
            if first.is_none() {
                first = Some((i, x, e, t));
            }
        }
        if d.is_finite() {
            max = max.max(d);
        }
    }
    match first {
        None => Ok(max),
        Some((i, x, e, t)) => Err(format!(
            "{bad} of {} elements out of tolerance; first at index {i}: cuda {x} cpu {e} (tol {t:.3e}); max |diff| {max:.3e}",
            a.len()
        )),
    }
}

fn base_cfg(w: u32, h: u32) -> Config {
    Config {
        network_image_width: w,
        network_image_height: h,
        image_mean: vec![0.485, 0.456, 0.406],
        image_stddev: vec![0.229, 0.224, 0.225],
        ..Config::default()
    }
}

/// Scenarios run on random frames of every encoding: (name, source w, h, row padding,
/// big-endian, config).
fn scenarios() -> Vec<(&'static str, u32, u32, u32, bool, Config)> {
    let mut v = Vec::new();
    let mut c = base_cfg(64, 48);
    c.resize_mode = ResizeMode::Stretch;
    v.push(("stretch-linear-nchw-f32", 97, 61, 0, false, c));
    let mut c = base_cfg(64, 64);
    c.output_layout = Layout::Nhwc;
    c.output_dtype = DType::Float16;
    c.channel_order = ChannelOrder::Bgr;
    c.pad_value = vec![10.0, 20.0, 30.0];
    v.push(("letterbox-nhwc-f16-bgr-pad", 150, 90, 13, false, c));
    let mut c = base_cfg(40, 40);
    c.resize_mode = ResizeMode::CenterCrop;
    c.interpolation = Interpolation::Nearest;
    c.output_dtype = DType::Float16;
    v.push(("centercrop-nearest-nchw-f16", 120, 200, 0, true, c));
    let mut c = base_cfg(36, 20);
    c.output_channels = 1;
    c.image_mean = vec![0.5];
    c.image_stddev = vec![0.25];
    c.output_layout = Layout::Nhwc;
    v.push(("grey-letterbox-nhwc-f32", 90, 77, 5, false, c));
    let mut c = base_cfg(48, 36);
    c.roi = vec![13, 7, 101, 77];
    c.letterbox_anchor = LetterboxAnchor::TopLeft;
    v.push(("roi-letterbox-topleft", 200, 150, 3, false, c));
    let mut c = base_cfg(67, 45);
    c.resize_mode = ResizeMode::Stretch;
    v.push(("upscale-odd-width", 17, 11, 1, false, c));
    let mut c = base_cfg(5, 3);
    c.resize_mode = ResizeMode::Stretch;
    c.output_layout = Layout::Nhwc;
    v.push(("tiny-1xN", 2, 37, 0, false, c));
    let mut c = base_cfg(32, 24);
    c.resize_mode = ResizeMode::Stretch;
    v.push(("downscale-22x-direct-path", 700, 500, 7, false, c));
    let mut c = base_cfg(128, 64);
    c.resize_mode = ResizeMode::Stretch;
    v.push(("downscale-2x-staged-nchw-f32", 256, 128, 0, false, c));
    let mut c = base_cfg(128, 64);
    c.resize_mode = ResizeMode::Stretch;
    c.output_layout = Layout::Nhwc;
    c.output_dtype = DType::Float16;
    v.push(("downscale-3x-nhwc-f16-padded", 384, 192, 29, true, c));
    let mut c = base_cfg(96, 64);
    c.resize_mode = ResizeMode::Stretch;
    c.output_layout = Layout::Nhwc;
    v.push(("nhwc-f32-vector-store", 250, 170, 2, false, c));
    let mut c = base_cfg(72, 30);
    c.output_channels = 1;
    c.image_mean = vec![0.0];
    c.image_stddev = vec![1.0];
    c.output_dtype = DType::Float16;
    c.interpolation = Interpolation::Nearest;
    v.push(("grey-nearest-f16", 333, 101, 0, false, c));
    v
}

/// conv2d cases: every kernel the configuration offers, built by the pipeline as the node
/// builds it, at several sizes and every border; plus random dense and random separable
/// weights (any values, not only the named kernels').
fn conv_cases(rng: &mut Rng) -> Vec<(String, Conv2dOp)> {
    let mut v = Vec::new();
    let kernels = [
        ConvKernel::Box,
        ConvKernel::Gaussian,
        ConvKernel::Sharpen,
        ConvKernel::SobelX,
        ConvKernel::SobelY,
        ConvKernel::Laplacian,
    ];
    for kernel in kernels {
        for size in [1u32, 3, 5, 7, 9, 15] {
            for border in [Border::Replicate, Border::Constant, Border::Reflect101] {
                let cfg = Config {
                    conv: ConvConfig { kernel, size, border, ..ConvConfig::default() },
                    ..Config::default()
                };
                match conv_op(&cfg) {
                    Ok(Some(op)) => v.push((format!("conv-{kernel:?}-k{size}-{border:?}"), op)),
                    Ok(None) => {}
                    Err(e) => println!("skipped conv {kernel:?} size {size}: {e}"),
                }
            }
        }
    }
    for &size in &[1u32, 3, 5, 7, 15] {
        for border in [Border::Replicate, Border::Constant, Border::Reflect101] {
            let n = (size * size) as usize;
            let weights: Vec<f32> =
                (0..n).map(|_| (rng.below(2001) as f32 - 1000.0) / 1000.0 / size as f32).collect();
            v.push((
                format!("conv-k{size}-{border:?}-2d"),
                Conv2dOp { size, weights, separable: None, border },
            ));
            let col: Vec<f32> =
                (0..size).map(|_| (rng.below(1001) as f32) / 1000.0 / size as f32).collect();
            let row: Vec<f32> = (0..size)
                .map(|_| (rng.below(1001) as f32 - 300.0) / 1000.0 / size as f32)
                .collect();
            let mut weights = vec![0.0f32; n];
            for r in 0..size as usize {
                for c in 0..size as usize {
                    weights[r * size as usize + c] = row[r] * col[c];
                }
            }
            v.push((
                format!("conv-k{size}-{border:?}-separable"),
                Conv2dOp { size, weights, separable: Some((col, row)), border },
            ));
        }
    }
    v
}

fn gpu_present() -> Result<bool, String> {
    // SAFETY: only tries to dlopen libcuda.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Ok(false);
    }
    if cudarc::driver::result::init().is_err() {
        return Ok(false);
    }
    Ok(cudarc::driver::result::device::get_count().map_err(|e| format!("{e:?}"))? > 0)
}

/// The three CUDA backends every case runs on: upload + direct fused path, mapped +
/// direct, upload + staged (shared-memory window) path.
const BACKENDS: [(MemoryMode, FusedPath); 3] = [
    (MemoryMode::Upload, FusedPath::Direct),
    (MemoryMode::Mapped, FusedPath::Direct),
    (MemoryMode::Upload, FusedPath::Staged),
];

/// Where a matrix case's frame comes from.
enum Src {
    /// Fresh random bytes: encoding, w, h, row padding, big-endian.
    Random(Encoding, u32, u32, u32, bool),
    /// The photograph `PHOTOS[i]` encoded into the encoding.
    Photo(usize, Encoding),
}

/// What a case checks.
enum Check {
    /// One frame through the CUDA backend against the CPU backend; `index` counts the
    /// matrix cases of every backend (`--stride` and the destination's rotation use it).
    Frame { src: Src, cfg: Box<Config>, conv: Option<usize>, index: usize },
    /// Two frames in flight through the ring (runs only with `--stride 1`).
    FramesInFlight,
    /// Shared device blocks (runs only with `--stride 1`).
    SharedBlocks,
    /// One batch configuration (`BATCHES[k]`).
    Batch(usize),
    /// Two batches in flight (pipelined).
    BatchesInFlight,
}

/// A named case: `--list` prints the names, `--filter` takes a part of one.
struct Case {
    name: String,
    /// Index into [`BACKENDS`].
    backend: usize,
    check: Check,
}

/// A decoded photograph: RGB8 pixels, width, height.
type Photo = (Vec<u8>, u32, u32);

/// What the checks share: tolerances, the seed, the CPU backend, the conv2d operations,
/// the decoded photographs, the tallies.
struct Ctx {
    tol: Tol,
    seed: u64,
    cpu: CpuBackend,
    convs: Vec<(String, Conv2dOp)>,
    photos: Vec<Result<Photo, String>>,
    st: Stats,
}

/// A passed (or not comparable) case.
enum Verdict {
    /// Passed: the text printed after its name; its largest difference and whether it
    /// took the staged path, for the summary.
    Passed { detail: String, max: Option<(DType, f64)>, staged: bool },
    /// The CPU backend rejected the configuration: not compared.
    NotCompared(String),
}

fn passed(detail: String) -> Verdict {
    Verdict::Passed { detail, max: None, staged: false }
}

/// The case's own random stream: `seed` and its name, so `--filter NAME` with the same
/// VP_PARITY_SEED reproduces its inputs.
fn case_rng(seed: u64, name: &str) -> Rng {
    let h = name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    Rng::new(seed ^ h)
}

/// Part 1: every scenario on fresh random frames of every encoding; part 2: the photographs, every
/// encoding, two configurations.
fn matrix_scenarios(push: &mut dyn FnMut(String, Src, Config, Option<usize>)) {
    for (sname, w, h, pad, be, cfg) in scenarios() {
        for enc in Encoding::ALL {
            let src = Src::Random(enc, w, h, pad, be && enc.is_16bit());
            push(format!("random {sname} {enc}"), src, cfg.clone(), None);
        }
    }
    let mut a = base_cfg(640, 480);
    a.pad_value = vec![114.0];
    let mut b = base_cfg(224, 224);
    b.resize_mode = ResizeMode::CenterCrop;
    b.output_layout = Layout::Nhwc;
    b.output_dtype = DType::Float16;
    b.channel_order = ChannelOrder::Bgr;
    for (p, (pname, _)) in PHOTOS.iter().enumerate() {
        for enc in Encoding::ALL {
            let name = format!("photo {pname} letterbox-640x480 {enc}");
            push(name, Src::Photo(p, enc), a.clone(), None);
            let name = format!("photo {pname} centercrop-224-nhwc-f16-bgr {enc}");
            push(name, Src::Photo(p, enc), b.clone(), None);
        }
    }
}

/// Part 3: conv2d: every size class, border, 2-D and separable path, on random rgb8 and grey
/// frames, NCHW f32 / NHWC f16 / non-multiple-of-tile sizes.
fn matrix_convs(
    convs: &[(String, Conv2dOp)],
    push: &mut dyn FnMut(String, Src, Config, Option<usize>),
) {
    for (k, (cname, _)) in convs.iter().enumerate() {
        let mut c = base_cfg(67, 35);
        c.resize_mode = ResizeMode::Stretch;
        let src = Src::Random(Encoding::Rgb8, 101, 57, 3, false);
        push(format!("random {cname} rgb8 nchw-f32 67x35"), src, c, Some(k));
        let mut c = base_cfg(40, 33);
        c.output_layout = Layout::Nhwc;
        c.output_dtype = DType::Float16;
        c.output_channels = 1;
        c.image_mean = vec![0.5];
        c.image_stddev = vec![0.5];
        let src = Src::Random(Encoding::BayerGrbg8, 80, 66, 0, false);
        push(format!("random {cname} bayer grey nhwc-f16 40x33"), src, c, Some(k));
    }
}

/// Part 5: Edge cases that pass validation but stress bounds (compute-sanitizer memcheck
/// runs these with `--filter edge`): every encoding at its minimum size (1x1; 2x1
/// for 4:2:2; 2x2 for 4:2:0), dense and padded rows, to 1x1, tiny, upscaled and
/// odd network sizes; a ROI on the last pixel, the last row and the last column;
/// the largest conv2d (15x15, every named kernel and random dense/separable
/// weights, every border) on network images smaller than the kernel.
fn matrix_edges(
    convs: &[(String, Conv2dOp)],
    push: &mut dyn FnMut(String, Src, Config, Option<usize>),
) {
    let shapes = [
        (1u32, 1u32, ResizeMode::Stretch, Layout::Nchw, DType::Float32),
        (3, 2, ResizeMode::Letterbox, Layout::Nhwc, DType::Float16),
        (64, 48, ResizeMode::CenterCrop, Layout::Nchw, DType::Float32),
        (67, 35, ResizeMode::Letterbox, Layout::Nhwc, DType::Float32),
    ];
    for enc in Encoding::ALL {
        for pad in [0u32, 3] {
            for (nw, nh, mode, layout, dtype) in shapes {
                let (fw, fh) = legal_size(enc, 1, 1);
                let mut c = base_cfg(nw, nh);
                c.resize_mode = mode;
                c.output_layout = layout;
                c.output_dtype = dtype;
                let name = format!(
                    "edge min-size {enc} {fw}x{fh} pad {pad} -> {nw}x{nh} {mode:?} {} {}",
                    layout.name(),
                    dtype.name()
                );
                push(name, Src::Random(enc, 1, 1, pad, pad > 0 && enc.is_16bit()), c, None);
            }
        }
        let (fw, fh) = legal_size(enc, 37, 23);
        let (w, h) = (i64::from(fw), i64::from(fh));
        for (what, roi) in [
            ("last-pixel", [w - 1, h - 1, 1, 1]),
            ("last-row", [0, h - 1, w, 1]),
            ("last-column", [w - 1, 0, 1, h]),
        ] {
            for interp in [Interpolation::Linear, Interpolation::Nearest] {
                let mut c = base_cfg(8, 6);
                c.roi = roi.to_vec();
                c.interpolation = interp;
                c.output_layout =
                    if interp == Interpolation::Linear { Layout::Nchw } else { Layout::Nhwc };
                let name = format!("edge roi-{what} {roi:?} {enc} {interp:?}");
                push(name, Src::Random(enc, 37, 23, 5, false), c, None);
            }
        }
    }
    for (ci, (cname, _)) in convs.iter().enumerate().filter(|(_, (_, c))| c.size == 15) {
        for (k, (nw, nh)) in [(1u32, 1u32), (2, 3), (7, 1), (1, 9), (15, 15), (16, 17), (33, 2)]
            .into_iter()
            .enumerate()
        {
            let mut c = base_cfg(nw, nh);
            c.resize_mode = ResizeMode::Stretch;
            if k % 2 == 1 {
                c.output_layout = Layout::Nhwc;
                c.output_dtype = DType::Float16;
            }
            if k % 3 == 2 {
                c.output_channels = 1;
                c.image_mean = vec![0.5];
                c.image_stddev = vec![0.5];
            }
            let fw = 1 + k as u32 % 3;
            let name = format!(
                "edge {cname} on {fw}x2 -> {nw}x{nh} {} {} {}ch",
                c.output_layout.name(),
                c.output_dtype.name(),
                c.output_channels
            );
            push(name, Src::Random(Encoding::Rgb8, fw, 2, 1, false), c, Some(ci));
        }
    }
}

/// Every case, backend by backend, in the order they run.
fn cases(convs: &[(String, Conv2dOp)]) -> Vec<Case> {
    let mut all = Vec::new();
    let mut index = 0;
    for (backend, (mode, path)) in BACKENDS.into_iter().enumerate() {
        let prefix = format!("[{mode:?} {path:?}]");
        let mut push = |name: String, src: Src, cfg: Config, conv: Option<usize>| {
            let check = Check::Frame { src, cfg: Box::new(cfg), conv, index };
            index += 1;
            all.push(Case { name: format!("{prefix} {name}"), backend, check });
        };
        matrix_scenarios(&mut push);
        matrix_convs(convs, &mut push);
        matrix_edges(convs, &mut push);
        let mut special = |name: &str, check| {
            all.push(Case { name: format!("{prefix} {name}"), backend, check });
        };
        special("two frames in flight", Check::FramesInFlight);
        special("shared device blocks", Check::SharedBlocks);
        for (k, bname) in BATCHES.iter().enumerate() {
            special(&format!("batch {bname} (5 slots, slot 2 padded)"), Check::Batch(k));
        }
        special("two batches in flight (pipelined)", Check::BatchesInFlight);
    }
    all
}

/// One matrix case: the frame through the CUDA backend (into a destination that rotates
/// with `index`) against the CPU backend.
fn frame_case(
    cx: &mut Ctx,
    gpu: &mut CudaBackend,
    path: FusedPath,
    rng: &mut Rng,
    (src, cfg, conv, index): (&Src, &Config, Option<usize>, usize),
) -> Result<Verdict, String> {
    let frame = match *src {
        Src::Random(enc, w, h, pad, be) => random_frame(rng, enc, w, h, pad, be),
        Src::Photo(p, enc) => {
            let (rgb, pw, ph) = cx.photos[p]
                .as_ref()
                .map_err(|e| format!("decoding test/data/{}: {e}", PHOTOS[p].0))?;
            photo_frame(rgb, *pw, *ph, enc, rng)
        }
    };
    let conv = conv.map(|k| &cx.convs[k].1);
    let op = build_op(cfg, &frame).map_err(|e| format!("building the operation: {e}"))?;
    let exp = match expected(&mut cx.cpu, &frame, cfg, conv) {
        Ok(x) => x,
        Err(e) => return Ok(Verdict::NotCompared(e)),
    };
    // The destination rotates: a heap Vec (the backend's own pinned buffer, then a
    // CPU copy), pinned memory from alloc_host with the tensor 64-byte aligned (the
    // direct path: the download, or in mapped mode the kernel, writes it there), and
    // the same 4 bytes off (mapped mode then takes its own buffer, upload mode
    // downloads to the unaligned address), as inside a serialized message.
    let mut out = vec![0xA5u8; 7];
    let result = match (index + 1) % 3 {
        0 => gpu.process(FrameWork::new(&frame.view(), &op, conv), &mut out),
        k => {
            let len = op.params.tensor_desc().byte_len();
            gpu.alloc_host(len + 128)
                .and_then(|mut buf| {
                    let base = buf.as_slice().as_ptr() as usize;
                    let at = (64 - base % 64) % 64 + if k == 2 { 4 } else { 0 };
                    let dst = &mut buf.as_mut_slice()[at..at + len];
                    gpu.process_into(FrameWork::new(&frame.view(), &op, conv), dst)?;
                    out = buf.as_slice()[at..at + len].to_vec();
                    Ok(())
                })
                .map(|_| Default::default())
        }
    }
    .map_err(|e| format!("CUDA backend: {e}"));
    let outcome = result
        .and_then(|_| compare(&out, &exp, cfg.output_dtype, &cx.tol, conv.map(|c| c.l1_norm())))
        .map(|d| Outcome {
            max_diff: d,
            staged: path == FusedPath::Staged
                && vision_preproc::backend::cuda::launch::staged_row_words(
                    &op.params, &op.x_map, frame.enc,
                ) > 0,
        });
    match outcome {
        Ok(o) => Ok(Verdict::Passed {
            detail: format!(
                " ({}x{} step {}): max |diff| {:.3e}{}",
                frame.w,
                frame.h,
                frame.step,
                o.max_diff,
                if o.staged { ", staged" } else { "" }
            ),
            max: Some((cfg.output_dtype, o.max_diff)),
            staged: o.staged,
        }),
        Err(e) => Err(format!("({}x{} step {} {}): {e}", frame.w, frame.h, frame.step, frame.enc)),
    }
}

/// The batch configurations (`Check::Batch(k)`: `batch_inputs`' `k`th configuration
/// with `batch_convs`' `k`th conv2d).
const BATCHES: [&str; 4] = [
    "letterbox-96x72-nchw-f32",
    "centercrop-64-nhwc-f16",
    "letterbox-67x35-nchw-f32-conv-separable",
    "letterbox-67x35-nhwc-f16-conv-dense",
];

/// The batches' frames (different sizes and encodings) and their four configurations.
fn batch_inputs(rng: &mut Rng) -> ([Frame; 5], [Config; 4]) {
    let frames = [
        random_frame(rng, Encoding::Bgr8, 160, 120, 0, false),
        random_frame(rng, Encoding::Yuyv, 98, 64, 6, false),
        random_frame(rng, Encoding::Nv12, 64, 48, 0, false),
        random_frame(rng, Encoding::Mono16, 50, 70, 2, true),
        random_frame(rng, Encoding::BayerRggb8, 33, 21, 1, false),
    ];
    let mut a = base_cfg(96, 72);
    a.pad_value = vec![114.0];
    let mut b = base_cfg(64, 64);
    b.resize_mode = ResizeMode::CenterCrop;
    b.output_layout = Layout::Nhwc;
    b.output_dtype = DType::Float16;
    let mut c = base_cfg(67, 35);
    c.pad_value = vec![10.0, 200.0, 30.0];
    let mut d = c.clone();
    d.output_layout = Layout::Nhwc;
    d.output_dtype = DType::Float16;
    (frames, [a, b, c, d])
}

/// The conv2d of each batch configuration: none, none, separable, dense 3x3.
fn batch_convs(convs: &[(String, Conv2dOp)]) -> [Option<&Conv2dOp>; 4] {
    let sep = convs.iter().find(|(n, _)| n.contains("separable")).map(|(_, c)| c);
    let dense = convs.iter().find(|(_, c)| c.separable.is_none() && c.size == 3).map(|(_, c)| c);
    [None, None, sep, dense]
}

/// Part 4: Two frames in flight through the ring, as the node and replay run them
/// (`Backend::submit_into`, `submit_into`, `finish_oldest`, `finish_oldest`): frames
/// of two sizes and encodings (new sampling tables between them), the first into a
/// heap buffer (copy out), the second into pinned memory (direct); then a third
/// submission refused while two are in flight.
/// (`--filter "frames in flight"` runs it alone.)
fn frames_in_flight(cx: &mut Ctx, gpu: &mut CudaBackend, rng: &mut Rng) -> Result<(), String> {
    let (cpu, tol) = (&mut cx.cpu, &cx.tol);
    let cfg = base_cfg(96, 72);
    let fa = random_frame(rng, Encoding::Bgr8, 160, 120, 0, false);
    let fb = random_frame(rng, Encoding::Yuyv, 98, 64, 6, false);
    let oa = build_op(&cfg, &fa)?;
    let ob = build_op(&cfg, &fb)?;
    let len = oa.params.tensor_desc().byte_len();
    let mut outa = vec![0u8; len];
    let mut outb = gpu.alloc_host(len).map_err(|e| e.to_string())?;
    let (va, vb) = (fa.view(), fb.view());
    let (pa, pb) = (outa.as_mut_ptr(), outb.as_mut_slice().as_mut_ptr());
    // SAFETY: both outputs live until the end of this closure and are not
    // touched before their finish_oldest returned.
    let queued = unsafe {
        (
            gpu.submit_into(Job::Frame(FrameWork::new(&va, &oa, None)), pa, len),
            gpu.submit_into(Job::Frame(FrameWork::new(&vb, &ob, None)), pb, len),
        )
    };
    for q in [queued.0, queued.1] {
        if q.map_err(|e| e.to_string())? != Queued::Pending {
            return Err("a CUDA submission was not left in flight".into());
        }
    }
    let mut spare = vec![0u8; len];
    // SAFETY: refused before anything is queued (checked below).
    let third = unsafe {
        gpu.submit_into(Job::Frame(FrameWork::new(&va, &oa, None)), spare.as_mut_ptr(), len)
    };
    if third.is_ok() {
        return Err("a third submission was accepted with two in flight".into());
    }
    gpu.finish_oldest().map_err(|e| format!("finish A: {e}"))?;
    gpu.finish_oldest().map_err(|e| format!("finish B: {e}"))?;
    if gpu.finish_oldest().is_ok() {
        return Err("finish_oldest with nothing in flight succeeded".into());
    }
    let ea = expected(cpu, &fa, &cfg, None)?;
    let eb = expected(cpu, &fb, &cfg, None)?;
    compare(&outa, &ea, DType::Float32, tol, None).map_err(|e| format!("frame A: {e}"))?;
    compare(outb.as_slice(), &eb, DType::Float32, tol, None)
        .map_err(|e| format!("frame B: {e}"))?;
    // Two batches in flight the same way: [A, padded], then [B, A].
    let b1 = [BatchSlot::frame(&va, &oa), BatchSlot { image: None, op: &oa }];
    let b2 = [BatchSlot::frame(&vb, &ob), BatchSlot::frame(&va, &oa)];
    let mut out1 = gpu.alloc_host(2 * len).map_err(|e| e.to_string())?;
    let mut out2 = vec![0u8; 2 * len];
    let (p1, p2) = (out1.as_mut_slice().as_mut_ptr(), out2.as_mut_ptr());
    // SAFETY: as above.
    unsafe {
        gpu.submit_into(Job::Batch(BatchWork::new(&b1, None)), p1, 2 * len)
            .map_err(|e| e.to_string())?;
        gpu.submit_into(Job::Batch(BatchWork::new(&b2, None)), p2, 2 * len)
            .map_err(|e| e.to_string())?;
    }
    gpu.finish_oldest().map_err(|e| format!("finish batch 1: {e}"))?;
    gpu.finish_oldest().map_err(|e| format!("finish batch 2: {e}"))?;
    let mut want1 = vec![0u8; 2 * len];
    let mut want2 = vec![0u8; 2 * len];
    cpu.process_batch_into(BatchWork::new(&b1, None), &mut want1).map_err(|e| e.to_string())?;
    cpu.process_batch_into(BatchWork::new(&b2, None), &mut want2).map_err(|e| e.to_string())?;
    compare(out1.as_slice(), &values(&want1, DType::Float32), DType::Float32, tol, None)
        .map_err(|e| format!("batch 1: {e}"))?;
    compare(&out2, &values(&want2, DType::Float32), DType::Float32, tol, None)
        .map_err(|e| format!("batch 2: {e}"))?;
    Ok(())
}

/// Part 5: Shared device blocks (`tensor_ref`, docs/HANDOFF.md): frame A into block 0
/// (device only), frame B into block 1 and also downloaded into pinned memory (what
/// a set gets when `tensor` is wanted too), then a batch [B, padded] into block 0,
/// two in flight; each block read back and compared with the CPU backend.
fn shared_blocks(cx: &mut Ctx, gpu: &mut CudaBackend, rng: &mut Rng) -> Result<(), String> {
    let (cpu, tol) = (&mut cx.cpu, &cx.tol);
    let cfg = base_cfg(96, 72);
    let fa = random_frame(rng, Encoding::Bgr8, 160, 120, 0, false);
    let fb = random_frame(rng, Encoding::Nv12, 98, 64, 0, false);
    let oa = build_op(&cfg, &fa)?;
    let ob = build_op(&cfg, &fb)?;
    let len = oa.params.tensor_desc().byte_len();
    let blocks = gpu
        .shared_blocks(2, 2 * len)
        .map_err(|e| format!("shared_blocks: {e}"))?
        .ok_or("the CUDA backend offered no device blocks")?;
    if blocks.len() != 2 || blocks.block_size() < 2 * len || blocks.fd(0) < 0 {
        return Err(format!(
            "{} blocks of {} bytes, fd {}",
            blocks.len(),
            blocks.block_size(),
            blocks.fd(0)
        ));
    }
    let read_back = |gpu: &CudaBackend, b: usize, n: usize| -> Result<Vec<u8>, String> {
        let mut v = vec![0u8; n];
        gpu.context().bind_to_thread().map_err(|e| format!("{e:?}"))?;
        // SAFETY: block b holds at least n bytes on the device; `v` has n bytes;
        // no work on it is pending (its submission was finished).
        unsafe {
            cudarc::driver::sys::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), blocks.address(b), n)
        }
        .result()
        .map_err(|e| format!("reading block {b}: {e:?}"))?;
        Ok(v)
    };
    let mut host_b = gpu.alloc_host(len).map_err(|e| e.to_string())?;
    let (va, vb) = (fa.view(), fb.view());
    // SAFETY: the blocks and `host_b` live until the end of this closure and
    // are not touched before their finish_oldest returned.
    // Each block's interprocess event (the H200 has them: attribute 125),
    // recorded by the submission into it.
    let events: Vec<_> = (0..2).map(|b| blocks.ready_event(b)).collect();
    let (Some(ev_a), Some(ev_b)) = (events[0], events[1]) else {
        return Err("the blocks have no interprocess events (attribute 125)".into());
    };
    if ev_a.handle == [0; 64] || ev_a.handle == ev_b.handle {
        return Err("the blocks' event handles are empty or equal".into());
    }
    unsafe {
        let ready = Some(ev_a.raw);
        let a = Out::Device { ptr: blocks.address(0), len, host: None, ready };
        let host = Some(host_b.as_mut_slice().as_mut_ptr());
        let ready = Some(ev_b.raw);
        let b = Out::Device { ptr: blocks.address(1), len, host, ready };
        gpu.submit_to(Job::Frame(FrameWork::new(&va, &oa, None)), a)
            .map_err(|e| format!("submit A: {e}"))?;
        gpu.submit_to(Job::Frame(FrameWork::new(&vb, &ob, None)), b)
            .map_err(|e| format!("submit B: {e}"))?;
    }
    gpu.finish_oldest().map_err(|e| format!("finish A: {e}"))?;
    gpu.finish_oldest().map_err(|e| format!("finish B: {e}"))?;
    for (name, e) in [("A", ev_a), ("B", ev_b)] {
        // SAFETY: the blocks' events, alive with `blocks`.
        let r = unsafe { cudarc::driver::sys::cuEventQuery(e.raw as _) };
        if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return Err(format!("frame {name}'s block event after its finish: {r:?}"));
        }
    }
    let ea = expected(cpu, &fa, &cfg, None)?;
    let eb = expected(cpu, &fb, &cfg, None)?;
    compare(&read_back(gpu, 0, len)?, &ea, DType::Float32, tol, None)
        .map_err(|e| format!("block 0 (frame A): {e}"))?;
    compare(&read_back(gpu, 1, len)?, &eb, DType::Float32, tol, None)
        .map_err(|e| format!("block 1 (frame B): {e}"))?;
    compare(host_b.as_slice(), &eb, DType::Float32, tol, None)
        .map_err(|e| format!("frame B's host copy: {e}"))?;
    let slots = [BatchSlot::frame(&vb, &ob), BatchSlot { image: None, op: &oa }];
    // SAFETY: as above.
    unsafe {
        let out = Out::Device { ptr: blocks.address(0), len: 2 * len, host: None, ready: None };
        gpu.submit_to(Job::Batch(BatchWork::new(&slots, None)), out).map_err(|e| e.to_string())?;
    }
    gpu.finish_oldest().map_err(|e| format!("finish the batch: {e}"))?;
    let mut want = vec![0u8; 2 * len];
    cpu.process_batch_into(BatchWork::new(&slots, None), &mut want).map_err(|e| e.to_string())?;
    compare(
        &read_back(gpu, 0, 2 * len)?,
        &values(&want, DType::Float32),
        DType::Float32,
        tol,
        None,
    )
    .map_err(|e| format!("batch in block 0: {e}"))?;
    Ok(())
}

/// Part 6: Batches: ONE launch of resize_normalize_batch for slots of different sizes
/// and encodings, a padded (stale) slot among them, both layouts and dtypes, with
/// and without conv2d (dense and separable), into a heap buffer and into aligned
/// pinned memory; expected = the CPU backend's batch (`--filter batch`). Batch
/// configuration `k` of [`BATCHES`]; its largest difference.
fn batch_case(cx: &mut Ctx, gpu: &mut CudaBackend, rng: &mut Rng, k: usize) -> Result<f64, String> {
    let (frames, cfgs) = batch_inputs(rng);
    let (cfg, conv) = (&cfgs[k], batch_convs(&cx.convs)[k]);
    let (cpu, tol) = (&mut cx.cpu, &cx.tol);
    let ops: Vec<PreprocessOp> =
        frames.iter().map(|f| build_op(cfg, f)).collect::<Result<_, _>>()?;
    let views: Vec<ImageView<'_>> = frames.iter().map(|f| f.view()).collect();
    let slots: Vec<BatchSlot<'_, '_>> = (0..frames.len())
        .map(|i| BatchSlot { image: (i != 2).then(|| (&views[i]).into()), op: &ops[i] })
        .collect();
    let len = ops[0].params.tensor_desc().byte_len() * slots.len();
    let mut want = vec![0u8; len];
    cpu.process_batch_into(BatchWork::new(&slots, conv), &mut want)
        .map_err(|e| format!("CPU: {e}"))?;
    let got = if k.is_multiple_of(2) {
        let mut out = vec![0xA5u8; len];
        gpu.process_batch_into(BatchWork::new(&slots, conv), &mut out)
            .map_err(|e| format!("CUDA: {e}"))?;
        out
    } else {
        let mut buf = gpu.alloc_host(len + 128).map_err(|e| e.to_string())?;
        let base = buf.as_slice().as_ptr() as usize;
        let at = (64 - base % 64) % 64;
        buf.as_mut_slice()[at..at + len].fill(0xA5);
        gpu.process_batch_into(BatchWork::new(&slots, conv), &mut buf.as_mut_slice()[at..at + len])
            .map_err(|e| format!("CUDA: {e}"))?;
        buf.as_slice()[at..at + len].to_vec()
    };
    let item = len / slots.len();
    let mut max = 0.0f64;
    for i in 0..slots.len() {
        let exp = values(&want[i * item..(i + 1) * item], cfg.output_dtype);
        let l1 = if i == 2 { None } else { conv.map(|c| c.l1_norm()) };
        let m = compare(&got[i * item..(i + 1) * item], &exp, cfg.output_dtype, tol, l1)
            .map_err(|e| format!("slot {i} ({}): {e}", frames[i].enc))?;
        max = max.max(m);
    }
    // The padded slot is exactly the pad value (no conv2d on it).
    if got[2 * item..3 * item] != want[2 * item..3 * item] {
        return Err("slot 2 (padded) differs from the CPU's pad value".into());
    }
    Ok(max)
}

/// Part 7: Two batches in flight (submit_into, submit_into, a third refused,
/// finish_oldest, finish_oldest): batch B's staging and upload on the copy stream
/// while batch A computes; each equals the CPU's batch, in order.
fn batches_in_flight(cx: &mut Ctx, gpu: &mut CudaBackend, rng: &mut Rng) -> Result<(), String> {
    let (frames, [a, _, c, _]) = batch_inputs(rng);
    let sep = batch_convs(&cx.convs)[2];
    let (cpu, tol) = (&mut cx.cpu, &cx.tol);
    let views: Vec<ImageView<'_>> = frames.iter().map(|f| f.view()).collect();
    let mut want = Vec::new();
    let mut ops_of = Vec::new();
    for cfg in [&a, &c] {
        let ops: Vec<PreprocessOp> =
            frames.iter().map(|f| build_op(cfg, f)).collect::<Result<_, _>>()?;
        ops_of.push(ops);
    }
    let batches: Vec<Vec<BatchSlot<'_, '_>>> = [(0, 2), (1, 4)]
        .iter()
        .map(|&(k, padded)| {
            (0..frames.len())
                .map(|i| BatchSlot {
                    image: (i != padded).then(|| (&views[i]).into()),
                    op: &ops_of[k][i],
                })
                .collect()
        })
        .collect();
    let convs_of = [None, sep];
    for (slots, conv) in batches.iter().zip(convs_of) {
        let len = slots[0].op.params.tensor_desc().byte_len() * slots.len();
        let mut w = vec![0u8; len];
        cpu.process_batch_into(BatchWork::new(slots, conv), &mut w)
            .map_err(|e| format!("CPU: {e}"))?;
        want.push(w);
    }
    // The first into pageable memory (through the entry's output and the copy
    // at the finish), the second into pinned memory (downloaded there directly).
    let (len0, len1) = (want[0].len(), want[1].len());
    let mut got0 = vec![0xA5u8; len0];
    let mut got1 = gpu.alloc_host(len1).map_err(|e| format!("alloc_host: {e}"))?;
    let outs = [(got0.as_mut_ptr(), len0), (got1.as_mut_slice().as_mut_ptr(), len1)];
    let ring = (|| -> Result<(), String> {
        for ((slots, conv), (ptr, len)) in batches.iter().zip(convs_of).zip(outs) {
            let job = Job::Batch(BatchWork::new(slots, conv));
            // SAFETY: got0 and got1 outlive both batches: finished below, or
            // abandoned (both streams waited for) when this fails.
            unsafe { gpu.submit_into(job, ptr, len) }.map_err(|e| format!("CUDA submit: {e}"))?;
        }
        if gpu.in_flight() != 2 {
            return Err(format!("{} batches in flight, not 2", gpu.in_flight()));
        }
        let mut spare = vec![0u8; len0];
        let job = Job::Batch(BatchWork::new(&batches[0], None));
        // SAFETY: refused (nothing queued), or abandoned at once below.
        match unsafe { gpu.submit_into(job, spare.as_mut_ptr(), len0) } {
            Ok(_) => {
                gpu.abandon_all();
                return Err("a third batch in flight was accepted".into());
            }
            // A misuse of the ring, never a device failure: refused before
            // anything is queued, the two batches in flight stay (and finish).
            Err(e)
                if e.is_device_failure() || !matches!(e, vision_preproc::Error::Misuse { .. }) =>
            {
                return Err(format!("the third batch's refusal is not a misuse: {e:?}"))
            }
            Err(_) if gpu.in_flight() != 2 => {
                return Err(format!(
                    "the refusal left {} batches in flight, not 2",
                    gpu.in_flight()
                ))
            }
            Err(_) => {}
        }
        for _ in 0..2 {
            gpu.finish_oldest().map_err(|e| format!("CUDA finish: {e}"))?;
        }
        Ok(())
    })();
    if ring.is_err() {
        gpu.abandon_all();
    }
    ring?;
    // alloc_host gives at least len1 bytes (pinned buffers are rounded up): the batch's
    // tensors are the first len1.
    let got1 = got1.as_slice().get(..len1).ok_or("alloc_host gave fewer bytes than asked")?;
    let gots = [got0, got1.to_vec()];
    for (k, ((w, cfg), got)) in want.iter().zip([&a, &c]).zip(gots).enumerate() {
        if got.len() != w.len() {
            return Err(format!("batch {k}: {} bytes, not {}", got.len(), w.len()));
        }
        let item = w.len() / frames.len();
        for i in 0..frames.len() {
            let exp = values(&w[i * item..(i + 1) * item], cfg.output_dtype);
            let padded = (k == 0 && i == 2) || (k == 1 && i == 4);
            let l1 = if padded { None } else { convs_of[k].map(|c| c.l1_norm()) };
            compare(&got[i * item..(i + 1) * item], &exp, cfg.output_dtype, tol, l1)
                .map_err(|e| format!("batch {k} slot {i}: {e}"))?;
        }
    }
    if gpu.in_flight() != 0 {
        return Err("batches left in flight".into());
    }
    Ok(())
}

/// Whether `--stride` runs this case: a matrix case when its index is a multiple of the
/// stride; the ring and shared-block checks only with `--stride 1`; batches always.
fn runs_at(case: &Case, stride: usize) -> bool {
    match case.check {
        Check::Frame { index, .. } => index.is_multiple_of(stride),
        Check::FramesInFlight | Check::SharedBlocks => stride == 1,
        Check::Batch(_) | Check::BatchesInFlight => true,
    }
}

/// Run one case and tally it: "ok   NAME ...", or "FAIL NAME: why" and the command that
/// reruns it alone.
fn run_case(cx: &mut Ctx, gpu: &mut CudaBackend, path: FusedPath, case: &Case, rerun: &str) {
    let mut rng = case_rng(cx.seed, &case.name);
    let rng = &mut rng;
    let res = match &case.check {
        Check::Frame { src, cfg, conv, index } => {
            frame_case(cx, gpu, path, rng, (src, cfg, *conv, *index))
        }
        Check::FramesInFlight => frames_in_flight(cx, gpu, rng).map(|()| passed(String::new())),
        Check::SharedBlocks => shared_blocks(cx, gpu, rng).map(|()| passed(String::new())),
        Check::Batch(k) => {
            batch_case(cx, gpu, rng, *k).map(|m| passed(format!(": max |diff| {m:.3e}")))
        }
        Check::BatchesInFlight => batches_in_flight(cx, gpu, rng).map(|()| passed(String::new())),
    };
    let st = &mut cx.st;
    match res {
        Ok(Verdict::Passed { detail, max, staged }) => {
            println!("ok   {}{detail}", case.name);
            st.passed += 1;
            st.staged += usize::from(staged);
            match max {
                Some((DType::Float32, d)) => st.max_f32 = st.max_f32.max(d),
                Some((DType::Float16, d)) => st.max_f16 = st.max_f16.max(d),
                None => {}
            }
        }
        Ok(Verdict::NotCompared(e)) => {
            st.not_compared += 1;
            *st.not_compared_kinds.entry(e).or_default() += 1;
        }
        Err(e) => {
            st.failed += 1;
            println!("FAIL {}: {e}", case.name);
            println!("     rerun it alone: {rerun} --filter '{}'", case.name);
        }
    }
}

/// `--list`: the case names (no GPU needed); `--filter TEXT`: the cases whose name
/// contains TEXT (only that one when TEXT is a whole name); `--stride N`: every Nth
/// matrix case (see `runs_at`).
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let arg =
        |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let stride: usize = arg("--stride").and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
    let filter = arg("--filter").unwrap_or_default();
    let seed =
        std::env::var("VP_PARITY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    let convs = conv_cases(&mut Rng::new(seed));
    let all = cases(&convs);
    let exact = all.iter().any(|c| c.name == filter);
    let selected = |c: &Case| if exact { c.name == filter } else { c.name.contains(&filter) };
    if args.iter().any(|a| a == "--list") {
        for case in all.iter().filter(|c| selected(c)) {
            println!("{}", case.name);
        }
        return ExitCode::SUCCESS;
    }
    match gpu_present() {
        Ok(true) => {}
        Ok(false) => {
            println!("no GPU: GPU tests NOT run (not counted as passed)");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!("GPU detection failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!("gpu_parity: seed {seed} (VP_PARITY_SEED={seed} reproduces), stride {stride}, filter {filter:?}");
    let photos = PHOTOS
        .iter()
        .map(|(_, bytes)| {
            let img = image::load_from_memory(bytes).map_err(|e| e.to_string())?.to_rgb8();
            let (pw, ph) = img.dimensions();
            Ok((img.into_raw(), pw, ph))
        })
        .collect();
    let tol = tolerances();
    let mut cx = Ctx { tol, seed, cpu: CpuBackend::new(), convs, photos, st: Stats::default() };
    let rerun = format!("VP_PARITY_SEED={seed} {}", args[0]);
    let t0 = Instant::now();
    for (b, (mode, path)) in BACKENDS.into_iter().enumerate() {
        let chosen: Vec<&Case> =
            all.iter().filter(|c| c.backend == b && selected(c) && runs_at(c, stride)).collect();
        if chosen.is_empty() {
            continue;
        }
        let cache = vision_preproc::backend::cuda::kernels::cache_dir();
        let mut gpu = match CudaBackend::new_with_options(0, mode, cache.as_deref(), path) {
            Ok(b) => b,
            Err(e) => {
                println!("FAIL: opening the CUDA backend ({mode:?}, {path:?}): {e}");
                return ExitCode::FAILURE;
            }
        };
        gpu.set_poison_outputs(true);
        println!("[{mode:?} {path:?}] {}", gpu.device_description());
        for case in chosen {
            run_case(&mut cx, &mut gpu, path, case, &rerun);
        }
        // The direct path ran (a third of the cases in upload mode; in mapped mode only
        // the aligned third can).
        println!("[{mode:?} {path:?}] {} frames straight into pinned memory", gpu.direct_frames());
        if stride == 1 && filter.is_empty() && gpu.direct_frames() == 0 {
            cx.st.failed += 1;
            println!("FAIL [{mode:?} {path:?}] no frame took the direct path into pinned memory");
            println!("     rerun: {rerun} --filter '[{mode:?} {path:?}]'");
        }
    }
    let (st, tol) = (&cx.st, &cx.tol);
    println!("---- not compared (the CPU backend rejected them) ----");
    for (why, n) in &st.not_compared_kinds {
        println!("{n:5} x {why}");
    }
    println!(
        "gpu_parity summary: {} passed, {} FAILED, {} NOT COMPARED ({} used the staged \
         shared-memory path); max |cuda - cpu| float32 {:.3e} (tol {:.1e} without conv2d, \
         x sum|w| with it), float16 {:.3e}; {:.1} s",
        st.passed,
        st.failed,
        st.not_compared,
        st.staged,
        st.max_f32,
        tol.f32_abs,
        st.max_f16,
        t0.elapsed().as_secs_f64()
    );
    if st.failed > 0 || st.not_compared > 0 || st.passed == 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
