//! `vision_preproc bench`: the fused kernel against the three-kernel path it replaces,
//! the tiled conv2d against a naive one, upload, download and the full frame, each timed
//! with CUDA events (warm-up, then `iterations` timed runs; mean, p50, p99), with the
//! bytes of the ledger, achieved GB/s, the percentage of a device-to-device copy measured
//! in the same run, occupancy and registers from the driver, the SM clock measured during
//! the run, and the time the ledger predicts on a Jetson Orin Nano at 68 and 31 GB/s.
//!
//! Inputs are random (never zeros) and rotate over enough buffer sets that each timed
//! run reads memory the previous runs did not leave in L2 (footprint >= 4x L2).

use super::kernels::{self, KernelFile};
use super::launch::{self, Conv2dParams};
use super::{drv_err, launch_kernel, CudaBackend};
use crate::backend::{Backend, Conv2dOp, PreprocessOp};
use crate::config::{Border, Config, MemoryMode, ResizeMode};
use crate::error::{CudaError, Result};
use crate::image::{Encoding, ImageView};
use crate::pipeline::{preprocess_op, Geometry};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use serde::Serialize;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Orin Nano DRAM bandwidth: the datasheet's 68 GB/s and the 31 GB/s that kernels
/// achieved in the Orin measurement of docs/GPU.md.
pub const ORIN_GBPS: [f64; 2] = [68.0, 31.0];

/// Benchmark settings.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// CUDA device ordinal.
    pub device_id: u32,
    /// Timed iterations per figure (the issue asks for >= 1000).
    pub iterations: u32,
    /// Untimed iterations first.
    pub warmup: u32,
    /// Also time compile-time variants of the fused kernel ([`FUSED_VARIANTS`]) and its
    /// direct (unstaged) path.
    pub variants: bool,
    /// Frame size cases to run, by index (0: 1280x720, 1: 1920x1200, 2: 4K); empty: all.
    pub cases: Vec<usize>,
    /// conv2d kernel sizes to time (tiled, naive, separable); empty: no conv2d figures.
    pub conv_sizes: Vec<u32>,
    /// Read each case's frame from `DIR/case<i>.raw` (exactly width x height x 3 bytes)
    /// instead of random bytes, and write the backend's tensor for it (with the frame
    /// conv2d) to `DIR/case<i>.tensor` (little-endian float32 NCHW), so another program
    /// can process the same bytes and compare.
    pub frames_dir: Option<std::path::PathBuf>,
    /// Gaussian conv2d size (`cv2.getGaussianKernel(k, 0)`, zero border) applied after
    /// the fused kernel in the "GPU frame" and "full frame" figures; 0: none.
    pub frame_conv: u32,
}

/// Compile-time variants of the fused kernel the benchmark can time beside the default
/// (direct path): (label, extra NVRTC options, staged path).
pub const FUSED_VARIANTS: [(&str, &[&str], bool); 5] = [
    ("variant staged (RN_STAGED=1)", &["-DRN_STAGED=1"], true),
    ("variant direct, word pairs", &["-DRN_WORD_PAIRS=1"], false),
    ("variant direct, >= 6 blocks/SM", &["-DRN_MIN_BLOCKS=6"], false),
    ("variant direct, no register cap", &["-DRN_MIN_BLOCKS=1"], false),
    ("variant direct, fast int->float", &["-DRN_FAST_CVT=1"], false),
];

/// What `run` produced: the full results (written to results.json) and a table.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// Everything, machine-readable.
    pub json: serde_json::Value,
    /// The human-readable table, with the targets' verdicts.
    pub table: String,
}

/// One timed figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// Frame size case (`1280x720 rgb8 -> 640x480 stretch`).
    pub case: String,
    /// What was timed (`fused`, `three-kernel`, `upload`, ...).
    pub figure: String,
    /// `events` or `wall clock` (the full frame includes CPU copies).
    pub timing: &'static str,
    /// Timed iterations.
    pub iterations: usize,
    /// Mean, microseconds.
    pub mean_us: f64,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Bytes through DRAM per iteration from the ledger.
    pub ledger_bytes: u64,
    /// ledger_bytes / p50.
    pub gbps: f64,
    /// gbps / the device-to-device copy bandwidth measured in this run.
    pub pct_copy_roof: f64,
    /// Kernels launched per iteration.
    pub kernels: Vec<String>,
    /// Resident blocks per SM of each kernel (occupancy API), with its block size.
    pub blocks_per_sm: Vec<u32>,
    /// Threads per block of each kernel.
    pub threads_per_block: Vec<u32>,
    /// Registers per thread of each kernel.
    pub registers: Vec<i32>,
    /// Dynamic + static shared memory per block of each kernel, bytes.
    pub smem_bytes: Vec<u32>,
    /// ledger_bytes at 68 GB/s, microseconds.
    pub orin_68gbps_us: f64,
    /// ledger_bytes at 31 GB/s, microseconds.
    pub orin_31gbps_us: f64,
}

#[derive(Debug, Clone, Copy)]
struct Stat {
    mean: f64,
    p50: f64,
    p99: f64,
}

fn stat(mut v: Vec<f64>) -> Stat {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len().max(1);
    let at =
        |q: f64| v.get(((q * n as f64).ceil() as usize).clamp(1, n) - 1).copied().unwrap_or(0.0);
    Stat { mean: v.iter().sum::<f64>() / n as f64, p50: at(0.5), p99: at(0.99) }
}

/// A kernel's resources for the table.
struct KernelInfo {
    name: String,
    blocks: u32,
    threads: u32,
    regs: i32,
    smem: u32,
}

fn kernel_info(f: &CudaFunction, name: &str, cfg: &LaunchConfig) -> Result<KernelInfo, CudaError> {
    let threads = cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2;
    let blocks = f
        .occupancy_max_active_blocks_per_multiprocessor(
            threads,
            cfg.shared_mem_bytes as usize,
            None,
        )
        .map_err(|e| drv_err(format!("occupancy of {name}"), e))?;
    let regs = f.num_regs().map_err(|e| drv_err(format!("registers of {name}"), e))?;
    let st = f.shared_size_bytes().map_err(|e| drv_err(format!("shared memory of {name}"), e))?;
    Ok(KernelInfo {
        name: name.into(),
        blocks,
        threads,
        regs,
        smem: cfg.shared_mem_bytes + st.max(0) as u32,
    })
}

/// splitmix64 for the random inputs.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

struct Bench<'a> {
    b: &'a mut CudaBackend,
    warmup: usize,
    roof_gbps: f64,
    figures: Vec<Figure>,
    notes: Vec<String>,
}

fn ptr(s: &CudaSlice<u8>, b: &CudaBackend) -> CUdeviceptr {
    let (p, _no_tracking) = s.device_ptr(&b.stream);
    p
}

impl Bench<'_> {
    fn alloc(&self, n: usize, what: &str) -> Result<CudaSlice<u8>, CudaError> {
        self.b
            .stream
            .alloc_zeros::<u8>(n.max(4))
            .map_err(|e| drv_err(format!("allocating {n} bytes for {what}"), e))
    }

    fn upload(&self, dst: &mut CudaSlice<u8>, data: &[u8]) -> Result<(), CudaError> {
        self.b
            .stream
            .memcpy_htod(data, &mut dst.slice_mut(..data.len()))
            .map_err(|e| drv_err("uploading bench data", e))
    }

    /// Time `body(i)` with a pair of timing events around each of `iters` runs (after
    /// `warmup` untimed runs); microseconds.
    fn time(
        &self,
        iters: usize,
        mut body: impl FnMut(usize) -> Result<(), CudaError>,
    ) -> Result<Vec<f64>, CudaError> {
        for i in 0..self.warmup {
            body(i)?;
        }
        let ev = || {
            self.b
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| drv_err("cuEventCreate", e))
        };
        let mut pairs: Vec<(CudaEvent, CudaEvent)> = Vec::with_capacity(iters);
        for _ in 0..iters {
            pairs.push((ev()?, ev()?));
        }
        for (i, (a, z)) in pairs.iter().enumerate() {
            a.record(&self.b.stream).map_err(|e| drv_err("cuEventRecord", e))?;
            body(self.warmup + i)?;
            z.record(&self.b.stream).map_err(|e| drv_err("cuEventRecord", e))?;
        }
        self.b.stream.synchronize().map_err(|e| drv_err("running the timed iterations", e))?;
        pairs
            .iter()
            .map(|(a, z)| {
                a.elapsed_ms(z)
                    .map(|ms| f64::from(ms) * 1e3)
                    .map_err(|e| drv_err("cuEventElapsedTime", e))
            })
            .collect()
    }

    fn push(
        &mut self,
        case: &str,
        figure: &str,
        timing: &'static str,
        times: Vec<f64>,
        ledger: u64,
        ks: &[KernelInfo],
    ) -> Stat {
        let n = times.len();
        let s = stat(times);
        let gbps = ledger as f64 / (s.p50 * 1e-6) / 1e9;
        self.figures.push(Figure {
            case: case.into(),
            figure: figure.into(),
            timing,
            iterations: n,
            mean_us: s.mean,
            p50_us: s.p50,
            p99_us: s.p99,
            ledger_bytes: ledger,
            gbps,
            pct_copy_roof: 100.0 * gbps / self.roof_gbps,
            kernels: ks.iter().map(|k| k.name.clone()).collect(),
            blocks_per_sm: ks.iter().map(|k| k.blocks).collect(),
            threads_per_block: ks.iter().map(|k| k.threads).collect(),
            registers: ks.iter().map(|k| k.regs).collect(),
            smem_bytes: ks.iter().map(|k| k.smem).collect(),
            orin_68gbps_us: ledger as f64 / (ORIN_GBPS[0] * 1e3),
            orin_31gbps_us: ledger as f64 / (ORIN_GBPS[1] * 1e3),
        });
        s
    }
}

/// The SM clock while a spin kernel runs, MHz (clock64 cycles over event time).
fn measure_clock(b: &CudaBackend, f: &CudaFunction) -> Result<f64, CudaError> {
    let out =
        b.stream.alloc_zeros::<u64>(1).map_err(|e| drv_err("allocating the clock probe", e))?;
    let (out_ptr, _t) = out.device_ptr(&b.stream);
    let cycles: u64 = 50_000_000;
    let ev = || {
        b.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| drv_err("cuEventCreate", e))
    };
    let mut best = 0.0f64;
    for _ in 0..3 {
        let (a, z) = (ev()?, ev()?);
        a.record(&b.stream).map_err(|e| drv_err("cuEventRecord", e))?;
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        launch_kernel!(b.stream, f, "measure_clock", cfg, &cycles, &out_ptr)?;
        z.record(&b.stream).map_err(|e| drv_err("cuEventRecord", e))?;
        let ms = a.elapsed_ms(&z).map_err(|e| drv_err("timing the clock probe", e))?;
        best = best.max(cycles as f64 / f64::from(ms) / 1e3);
    }
    Ok(best)
}

/// UTC date and time of `t` as `YYYY-MM-DD HH:MM:SS` (civil-from-days, no dependency).
fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

struct SizeCase {
    name: String,
    enc: Encoding,
    src: (u32, u32),
    cfg: Config,
}

fn size_cases() -> Vec<SizeCase> {
    let cfg = |w: u32, h: u32, mode: ResizeMode| Config {
        network_image_width: w,
        network_image_height: h,
        resize_mode: mode,
        ..Config::default()
    };
    vec![
        SizeCase {
            name: "1280x720 rgb8 -> 640x480 stretch (Orin reference)".into(),
            enc: Encoding::Rgb8,
            src: (1280, 720),
            cfg: cfg(640, 480, ResizeMode::Stretch),
        },
        SizeCase {
            name: "1920x1200 bgr8 -> 640x480 letterbox (Isaac ROS encoder)".into(),
            enc: Encoding::Bgr8,
            src: (1920, 1200),
            cfg: cfg(640, 480, ResizeMode::Letterbox),
        },
        SizeCase {
            name: "3840x2160 rgb8 -> 1920x1080 stretch (4K)".into(),
            enc: Encoding::Rgb8,
            src: (3840, 2160),
            cfg: cfg(1920, 1080, ResizeMode::Stretch),
        },
    ]
}

/// Source bytes the fused kernel must read: the rows its y table touches, over the
/// column span its x table touches.
fn source_ledger(op: &PreprocessOp, bpp: u32) -> u64 {
    let mut rows: Vec<i32> = op.y_map.i0.iter().chain(&op.y_map.i1).copied().collect();
    rows.sort_unstable();
    rows.dedup();
    let lo = op.x_map.i0.iter().copied().min().unwrap_or(0);
    let hi = op.x_map.i1.iter().copied().max().unwrap_or(-1);
    rows.len() as u64 * (hi - lo + 1).max(0) as u64 * u64::from(bpp)
}

/// The Gaussian conv2d of the "GPU frame" figures (zero border, as `torch`'s
/// `conv2d(padding=k // 2)`), or `None` for `k == 0`.
fn frame_conv_op(k: u32, cfg: &Config) -> Result<Option<Conv2dOp>> {
    if k == 0 {
        return Ok(None);
    }
    let mut c = cfg.clone();
    c.conv = crate::config::ConvConfig {
        kernel: crate::config::ConvKernel::Gaussian,
        size: k,
        sigma: 0.0,
        weights: Vec::new(),
        border: Border::Constant,
    };
    crate::pipeline::conv_op(&c)
}

/// Sets of buffers of `footprint` bytes needed so that rotating over them defeats L2.
fn rotation(footprint: u64, l2: i32) -> usize {
    (4 * u64::from(l2.max(0) as u32)).div_ceil(footprint.max(1)).clamp(1, 32) as usize
}

/// Run the whole benchmark on device `opts.device_id`.
pub fn run(opts: &BenchOptions) -> Result<BenchReport> {
    let started = SystemTime::now();
    let mut backend = CudaBackend::new(opts.device_id, MemoryMode::Upload)?;
    let dev = backend.device.clone();
    let (bl_module, _) = kernels::load(
        &backend.ctx,
        KernelFile::Baselines,
        &dev.arch,
        dev.driver_version,
        kernels::cache_dir().as_deref(),
        &[],
    )?;
    let names: Vec<String> = kernels::BASELINE_ENTRIES.iter().map(|s| s.to_string()).collect();
    let bl = kernels::functions(&bl_module, KernelFile::Baselines, &names)?;
    let (bl_resize, bl_norm, bl_chw, bl_naive, bl_clock) = (&bl[0], &bl[1], &bl[2], &bl[3], &bl[4]);
    let iters = opts.iterations.max(1) as usize;
    let clock_before = measure_clock(&backend, bl_clock)?;
    let mut bench = Bench {
        b: &mut backend,
        warmup: opts.warmup as usize,
        roof_gbps: 1.0,
        figures: Vec::new(),
        notes: Vec::new(),
    };
    let mut rng = Rng(started.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7));

    // The roof: a device-to-device copy of 4x L2 (at least 256 MiB), read + write bytes.
    let roof_bytes = (4 * dev.l2_bytes.max(0) as usize).max(256 << 20);
    let mut roof_src = bench.alloc(roof_bytes, "the copy roof")?;
    let roof_dst = bench.alloc(roof_bytes, "the copy roof")?;
    let fill = rng.bytes(roof_bytes);
    bench.upload(&mut roof_src, &fill)?;
    drop(fill);
    let (rs, rd) = (ptr(&roof_src, bench.b), ptr(&roof_dst, bench.b));
    let cu_stream = bench.b.stream.cu_stream();
    let t = bench.time(iters.min(200), |_| {
        // SAFETY: both buffers have roof_bytes bytes and live until the end of this scope.
        unsafe { sys::cuMemcpyDtoDAsync_v2(rd, rs, roof_bytes, cu_stream) }
            .result()
            .map_err(|e| drv_err("copy roof", e))
    })?;
    let roof = stat(t);
    bench.roof_gbps = 2.0 * roof_bytes as f64 / (roof.p50 * 1e-6) / 1e9;
    bench.push(
        "device",
        &format!("copy roof ({} MiB dtod)", roof_bytes >> 20),
        "events",
        vec![roof.p50],
        2 * roof_bytes as u64,
        &[],
    );
    drop((roof_src, roof_dst));

    let mut ledgers = Vec::new();
    for (ci, sc) in size_cases().into_iter().enumerate() {
        if !opts.cases.is_empty() && !opts.cases.contains(&ci) {
            continue;
        }
        let (sw, sh) = sc.src;
        let step = sw * sc.enc.bytes_per_pixel();
        let frame_bytes = (step * sh) as usize;
        let g = Geometry::resolve(&sc.cfg, sw, sh)?;
        let mut op = preprocess_op(&sc.cfg, &g);
        op.params.src_step = step;
        op.params.encoding = sc.enc as u32;
        let p = op.params;
        let desc = p.tensor_desc();
        let out_bytes = desc.byte_len();
        let maps_bytes = 12 * (op.x_map.i0.len() + op.y_map.i0.len()) as u64;
        let fused_ledger =
            source_ledger(&op, sc.enc.bytes_per_pixel()) + out_bytes as u64 + maps_bytes;
        let sets = rotation(frame_bytes as u64 + out_bytes as u64, dev.l2_bytes);
        let frame = match &opts.frames_dir {
            Some(dir) => {
                let path = dir.join(format!("case{ci}.raw"));
                let v = std::fs::read(&path)
                    .map_err(|e| crate::Error::io(format!("reading {}", path.display()), e))?;
                if v.len() != frame_bytes {
                    return Err(crate::Error::config(
                        "frames",
                        path.display(),
                        format!(
                            "case {ci} needs exactly {frame_bytes} bytes ({sw}x{sh}x3), got {}",
                            v.len()
                        ),
                    ));
                }
                v
            }
            None => rng.bytes(frame_bytes),
        };
        let view = ImageView::with_encoding(sw, sh, step, sc.enc, false, &frame)?;
        let conv = frame_conv_op(opts.frame_conv, &sc.cfg)?;
        // The backend uploads the tables and sizes its buffers on a first frame.
        let mut out = Vec::new();
        bench.b.process(&view, &op, None, &mut out)?;
        let maps = bench
            .b
            .maps_dev
            .ptr(&bench.b.stream)
            .ok_or_else(|| drv_err("bench", "tables not uploaded"))?;
        let mut srcs = Vec::new();
        let mut dsts = Vec::new();
        for _ in 0..sets {
            let mut s = bench.alloc(frame_bytes + super::memory::SRC_SLACK, "frames")?;
            if opts.frames_dir.is_some() {
                bench.upload(&mut s, &frame)?;
            } else {
                bench.upload(&mut s, &rng.bytes(frame_bytes))?;
            }
            srcs.push(s);
            dsts.push(bench.alloc(out_bytes, "tensors")?);
        }
        let src_p: Vec<CUdeviceptr> = srcs.iter().map(|s| ptr(s, bench.b)).collect();
        let dst_p: Vec<CUdeviceptr> = dsts.iter().map(|s| ptr(s, bench.b)).collect();

        // Fused.
        // The backend's default: the direct path (no shared-memory window).
        let words = 0u32;
        let cfg = launch::resize_normalize_cfg(
            &p,
            words,
            super::resident_blocks(&bench.b.resize[sc.enc as usize], words, dev.multiprocessors),
        );
        let f = bench.b.resize[sc.enc as usize].clone();
        let fname = kernels::RESIZE_NORMALIZE_ENTRIES[sc.enc as usize];
        let stream = bench.b.stream.clone();
        let t = bench.time(iters, |i| {
            let (s, d) = (src_p[i % sets], dst_p[i % sets]);
            launch_kernel!(stream, &f, fname, cfg, &p, &s, &maps, &d, &words)
        })?;
        let info = kernel_info(&f, fname, &cfg)?;
        let fused = bench.push(
            &sc.name,
            &format!("fused ({})", if words > 0 { "staged" } else { "direct" }),
            "events",
            t,
            fused_ledger,
            &[info],
        );
        if opts.variants {
            // The same kernel with one block per tile (a partial last wave) instead of
            // resident persistent blocks.
            let all = launch::resize_normalize_cfg(&p, words, u32::MAX);
            let t = bench.time(iters, |i| {
                let (s, d) = (src_p[i % sets], dst_p[i % sets]);
                launch_kernel!(stream, &f, fname, all, &p, &s, &maps, &d, &words)
            })?;
            let info = kernel_info(&f, fname, &all)?;
            bench.push(&sc.name, "variant one block per tile", "events", t, fused_ledger, &[info]);
            for (label, extra, staged) in FUSED_VARIANTS {
                let mut o = kernels::compile_options(&dev.arch);
                o.extend(extra.iter().map(|e| e.to_string()));
                let c = kernels::compile_with_options(KernelFile::ResizeNormalize, &dev.arch, &o)?;
                let m = bench
                    .b
                    .ctx
                    .load_module(cudarc::nvrtc::Ptx::from_binary(c.cubin))
                    .map_err(|e| drv_err(format!("loading {label}"), e))?;
                let vf = m
                    .load_function(fname)
                    .map_err(|e| drv_err(format!("{fname} in {label}"), e))?;
                let vw = if staged { launch::staged_row_words(&p, &op.x_map, sc.enc) } else { 0 };
                let vcfg = launch::resize_normalize_cfg(
                    &p,
                    vw,
                    super::resident_blocks(&vf, vw, dev.multiprocessors),
                );
                let t = bench.time(iters, |i| {
                    let (s, d) = (src_p[i % sets], dst_p[i % sets]);
                    launch_kernel!(stream, &vf, fname, vcfg, &p, &s, &maps, &d, &vw)
                })?;
                let info = kernel_info(&vf, fname, &vcfg)?;
                let label = if staged && vw == 0 {
                    format!("{label} [window too wide: direct]")
                } else {
                    label.to_string()
                };
                bench.push(&sc.name, &label, "events", t, fused_ledger, &[info]);
                // The variant must compute the same tensor, bit for bit.
                let d1 = dst_p[1 % sets];
                launch_kernel!(stream, &vf, fname, vcfg, &p, &src_p[0], &maps, &dst_p[0], &vw)?;
                launch_kernel!(stream, &f, fname, cfg, &p, &src_p[0], &maps, &d1, &words)?;
                let mut a = vec![0u8; out_bytes];
                let mut bb = vec![0u8; out_bytes];
                stream
                    .memcpy_dtoh(&dsts[0].slice(..out_bytes), &mut a)
                    .map_err(|e| drv_err("bench readback", e))?;
                stream
                    .memcpy_dtoh(&dsts[1 % sets].slice(..out_bytes), &mut bb)
                    .map_err(|e| drv_err("bench readback", e))?;
                bench.notes.push(format!(
                    "{}: {label}: output {} the default's",
                    sc.name,
                    if a == bb { "bit-identical to" } else { "DIFFERS from" }
                ));
            }
        }

        // Three-kernel path: resize u8 -> normalize f32 HWC -> CHW.
        let npx = (p.dst_width * p.dst_height) as usize;
        let tmp_u8 = bench.alloc(npx * 3, "three-kernel u8")?;
        let tmp_f32 = bench.alloc(npx * 12, "three-kernel f32 HWC")?;
        let (tu8, tf32) = (ptr(&tmp_u8, bench.b), ptr(&tmp_f32, bench.b));
        let c1 = launch::linear_cfg(npx as u32);
        let c3 = launch::linear_cfg(npx as u32 * 3);
        let three = |i: usize| -> Result<(), CudaError> {
            let (s, d) = (src_p[i % sets], dst_p[i % sets]);
            launch_kernel!(stream, bl_resize, "baseline_resize_rgb8", c1, &p, &s, &maps, &tu8)?;
            launch_kernel!(stream, bl_norm, "baseline_normalize_hwc", c3, &p, &tu8, &tf32)?;
            launch_kernel!(stream, bl_chw, "baseline_hwc_to_chw", c3, &p, &tf32, &d)
        };
        let t = bench.time(iters, three)?;
        let three_ledger = source_ledger(&op, 3)
            + maps_bytes
            + 2 * (npx * 3) as u64
            + 2 * (npx * 12) as u64
            + out_bytes as u64;
        let infos = [
            kernel_info(bl_resize, "baseline_resize_rgb8", &c1)?,
            kernel_info(bl_norm, "baseline_normalize_hwc", &c3)?,
            kernel_info(bl_chw, "baseline_hwc_to_chw", &c3)?,
        ];
        let threek = bench.push(&sc.name, "three-kernel", "events", t, three_ledger, &infos);
        bench.notes.push(format!(
            "{}: fused {:.1} us vs three-kernel {:.1} us (p50) = {:.2}x; the ledger predicts {:.2}x ({:.2} MB vs {:.2} MB)",
            sc.name, fused.p50, threek.p50, threek.p50 / fused.p50, three_ledger as f64 / fused_ledger as f64,
            fused_ledger as f64 / 1e6, three_ledger as f64 / 1e6
        ));
        // Sanity: the baseline computes about the same tensor (u8 rounding in between).
        if sc.cfg.resize_mode == ResizeMode::Stretch {
            let mut a = vec![0u8; out_bytes];
            let mut bb = vec![0u8; out_bytes];
            three(0)?;
            launch_kernel!(stream, &f, fname, cfg, &p, &src_p[0], &maps, &tf32, &words)?;
            stream
                .memcpy_dtoh(&dsts[0].slice(..out_bytes), &mut a)
                .map_err(|e| drv_err("bench readback", e))?;
            stream
                .memcpy_dtoh(&tmp_f32.slice(..out_bytes), &mut bb)
                .map_err(|e| drv_err("bench readback", e))?;
            let max = a
                .chunks_exact(4)
                .zip(bb.chunks_exact(4))
                .map(|(x, y)| {
                    let (x, y) = (
                        f32::from_le_bytes([x[0], x[1], x[2], x[3]]),
                        f32::from_le_bytes([y[0], y[1], y[2], y[3]]),
                    );
                    (x - y).abs()
                })
                .fold(0.0f32, f32::max);
            bench.notes.push(format!("{}: three-kernel vs fused output max |diff| {max:.4} (expected <= 0.5/255/0.5 = 0.0039 from the u8 rounding)", sc.name));
        }
        drop((tmp_u8, tmp_f32));

        // Upload (pinned write-combined -> device) and download (device -> pinned cached).
        let mut up_host = super::memory::PinnedBuffer::new(
            &bench.b.ctx,
            frame_bytes,
            super::memory::PinnedKind::Upload,
        )?;
        // SAFETY: freshly allocated, no GPU work uses it yet.
        unsafe { up_host.host_mut()[..frame_bytes].copy_from_slice(&frame) };
        let down_host = super::memory::PinnedBuffer::new(
            &bench.b.ctx,
            out_bytes,
            super::memory::PinnedKind::Download,
        )?;
        let (uh, dh) = (up_host.host_ptr(), down_host.host_ptr());
        let t = bench.time(iters, |i| {
            // SAFETY: uh holds frame_bytes bytes, the device set at least as many; both
            // outlive the synchronize at the end of `time`.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(src_p[i % sets], uh as *const _, frame_bytes, cu_stream)
            }
            .result()
            .map_err(|e| drv_err("upload", e))
        })?;
        bench.push(
            &sc.name,
            "upload (pinned WC -> device)",
            "events",
            t,
            frame_bytes as u64 * 2,
            &[],
        );
        let t = bench.time(iters, |i| {
            // SAFETY: as above, for out_bytes into the cached pinned buffer.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(dh as *mut _, dst_p[i % sets], out_bytes, cu_stream)
            }
            .result()
            .map_err(|e| drv_err("download", e))
        })?;
        bench.push(&sc.name, "download (device -> pinned)", "events", t, out_bytes as u64 * 2, &[]);

        // The GPU frame: upload + fused + conv2d + download on the stream, events around
        // the four (the work a PyTorch pipeline on the same frame does; no CPU copies).
        let conv_ledger = if conv.is_some() { 2 * out_bytes as u64 } else { 0 };
        if let Some(c) = &conv {
            bench.b.ensure_conv_constants(c)?;
            let mut scratch = Vec::with_capacity(sets);
            for _ in 0..sets {
                scratch.push(bench.alloc(out_bytes, "conv2d input")?);
            }
            let scr_p: Vec<CUdeviceptr> = scratch.iter().map(|s| ptr(s, bench.b)).collect();
            let (cp, fc, cname) = bench.b.conv_launch(&p, c);
            let fc = fc.clone();
            let ccfg = launch::conv_tiled_cfg(p.dst_width, p.dst_height);
            let fi = kernel_info(&f, fname, &cfg)?;
            let ci_ = kernel_info(&fc, &cname, &ccfg)?;
            // Conv2d alone, then the whole GPU frame.
            let t = bench.time(iters, |i| {
                launch_kernel!(stream, &fc, cname, ccfg, &cp, &scr_p[i % sets], &dst_p[i % sets])
            })?;
            bench.push(
                &sc.name,
                &format!("conv2d {}x{} gaussian", c.size, c.size),
                "events",
                t,
                conv_ledger,
                &[kernel_info(&fc, &cname, &ccfg)?],
            );
            let t = bench.time(iters, |i| {
                let (s, sc_, d) = (src_p[i % sets], scr_p[i % sets], dst_p[i % sets]);
                launch_kernel!(stream, &f, fname, cfg, &p, &s, &maps, &sc_, &words)?;
                launch_kernel!(stream, &fc, cname, ccfg, &cp, &sc_, &d)
            })?;
            bench.push(
                &sc.name,
                "fused + conv2d (device only)",
                "events",
                t,
                fused_ledger + conv_ledger,
                &[kernel_info(&f, fname, &cfg)?, kernel_info(&fc, &cname, &ccfg)?],
            );
            let t = bench.time(iters, |i| {
                let (s, sc_, d) = (src_p[i % sets], scr_p[i % sets], dst_p[i % sets]);
                // SAFETY: uh holds frame_bytes bytes and s at least as many; dh holds
                // out_bytes and d as many; all outlive the synchronize at the end of `time`.
                unsafe { sys::cuMemcpyHtoDAsync_v2(s, uh as *const _, frame_bytes, cu_stream) }
                    .result()
                    .map_err(|e| drv_err("upload", e))?;
                launch_kernel!(stream, &f, fname, cfg, &p, &s, &maps, &sc_, &words)?;
                launch_kernel!(stream, &fc, cname, ccfg, &cp, &sc_, &d)?;
                // SAFETY: as above.
                unsafe { sys::cuMemcpyDtoHAsync_v2(dh as *mut _, d, out_bytes, cu_stream) }
                    .result()
                    .map_err(|e| drv_err("download", e))
            })?;
            bench.push(
                &sc.name,
                "GPU frame (upload + fused + conv2d + download)",
                "events",
                t,
                2 * frame_bytes as u64 + fused_ledger + conv_ledger + 2 * out_bytes as u64,
                &[fi, ci_],
            );
            drop(scratch);
        }
        let t = bench.time(iters, |i| {
            let (s, d) = (src_p[i % sets], dst_p[i % sets]);
            // SAFETY: as for the GPU frame above.
            unsafe { sys::cuMemcpyHtoDAsync_v2(s, uh as *const _, frame_bytes, cu_stream) }
                .result()
                .map_err(|e| drv_err("upload", e))?;
            launch_kernel!(stream, &f, fname, cfg, &p, &s, &maps, &d, &words)?;
            // SAFETY: as above.
            unsafe { sys::cuMemcpyDtoHAsync_v2(dh as *mut _, d, out_bytes, cu_stream) }
                .result()
                .map_err(|e| drv_err("download", e))
        })?;
        bench.push(
            &sc.name,
            "GPU frame without conv2d (upload + fused + download)",
            "events",
            t,
            2 * frame_bytes as u64 + fused_ledger + 2 * out_bytes as u64,
            &[],
        );
        drop((up_host, down_host, srcs, dsts));
        ledgers.push(serde_json::json!({
            "case": sc.name, "frame_bytes": frame_bytes, "tensor_bytes": out_bytes,
            "fused": fused_ledger, "conv2d": conv_ledger,
            "conv_size": conv.as_ref().map_or(0, |c| c.size),
            "conv_weights": conv.as_ref().map(|c| c.weights.clone()),
            "gpu_frame_discrete": 2 * frame_bytes as u64 + fused_ledger + conv_ledger + 2 * out_bytes as u64,
            "jetson_mapped_frame_kernels": fused_ledger + conv_ledger,
            "jetson_mapped_frame_with_cpu_copies": fused_ledger + conv_ledger + 2 * frame_bytes as u64 + 2 * out_bytes as u64,
        }));

        // The full frame through the backend (CPU copies into and out of pinned memory
        // included), in both memory modes. Ledger: the Jetson's mapped path, frame
        // copied in (read + write), read by the kernel, tensor written, copied out.
        let full_ledger = 3 * frame_bytes as u64 + 3 * out_bytes as u64 + conv_ledger;
        let conv_ref = conv.as_ref();
        if let Some(dir) = &opts.frames_dir {
            // The tensor another program compares against: this frame through the backend.
            bench.b.process(&view, &op, conv_ref, &mut out)?;
            let path = dir.join(format!("case{ci}.tensor"));
            std::fs::write(&path, &out)
                .map_err(|e| crate::Error::io(format!("writing {}", path.display()), e))?;
        }
        let with = if conv.is_some() { " + conv2d" } else { "" };
        let mut wall = |b: &mut CudaBackend| -> Result<Vec<f64>> {
            let mut v = Vec::with_capacity(iters);
            for i in 0..opts.warmup as usize + iters {
                let t0 = Instant::now();
                b.process(&view, &op, conv_ref, &mut out)?;
                if i >= opts.warmup as usize {
                    v.push(t0.elapsed().as_secs_f64() * 1e6);
                }
            }
            Ok(v)
        };
        let t = wall(bench.b)?;
        bench.push(
            &sc.name,
            &format!("full frame{with}, upload mode"),
            "wall clock",
            t,
            full_ledger,
            &[],
        );
        let mut mapped = CudaBackend::new(opts.device_id, MemoryMode::Mapped)?;
        let t = wall(&mut mapped)?;
        bench.push(
            &sc.name,
            &format!("full frame{with}, mapped mode"),
            "wall clock",
            t,
            full_ledger,
            &[],
        );
    }

    if !opts.conv_sizes.is_empty() {
        // conv2d on 1920x1080x3 float32 (NCHW in, NCHW f32 out), reflect101 border.
        let (w, h, c) = (1920u32, 1080u32, 3u32);
        let plane_bytes = (w * h * c) as usize * 4;
        let sets = rotation(2 * plane_bytes as u64, dev.l2_bytes);
        let mut ins = Vec::new();
        let mut outs = Vec::new();
        for _ in 0..sets {
            let vals: Vec<u8> = rng
                .bytes(plane_bytes / 4)
                .iter()
                .flat_map(|&b| (f32::from(b) / 64.0 - 2.0).to_le_bytes())
                .collect();
            let mut s = bench.alloc(plane_bytes, "conv input")?;
            bench.upload(&mut s, &vals)?;
            ins.push(s);
            outs.push(bench.alloc(plane_bytes, "conv output")?);
        }
        let in_p: Vec<CUdeviceptr> = ins.iter().map(|s| ptr(s, bench.b)).collect();
        let out_p: Vec<CUdeviceptr> = outs.iter().map(|s| ptr(s, bench.b)).collect();
        let ledger = 2 * plane_bytes as u64;
        let case = "conv2d 1920x1080x3 float32, reflect101".to_string();
        let stream = bench.b.stream.clone();
        for &k in &opts.conv_sizes {
            let n = (k * k) as usize;
            let weights: Vec<f32> =
                rng.bytes(n).iter().map(|&b| f32::from(b) / 255.0 - 0.5).collect();
            let op = Conv2dOp {
                size: k,
                weights: weights.clone(),
                separable: None,
                border: Border::Reflect101,
            };
            bench.b.ensure_conv_constants(&op)?;
            {
                let bytes: Vec<u8> = weights.iter().flat_map(|v| v.to_le_bytes()).collect();
                let mut sym = bl_module
                    .get_global("c_naive_w", &stream)
                    .map_err(|e| drv_err("c_naive_w", e))?;
                stream
                    .memcpy_htod(&bytes, &mut sym.slice_mut(..bytes.len()))
                    .map_err(|e| drv_err("c_naive_w", e))?;
            }
            let cp = Conv2dParams {
                width: w,
                height: h,
                channels: c,
                size: k,
                border: Border::Reflect101 as u32,
                layout: 0,
                dtype: 0,
            };
            let ki = kernels::CONV_SIZES.iter().position(|&s| s == k).unwrap_or(0);
            let ft = bench.b.conv_tiled[ki].clone();
            let tname = format!("conv2d_tiled_k{k}");
            let tcfg = launch::conv_tiled_cfg(w, h);
            let t = bench.time(iters, |i| {
                launch_kernel!(stream, &ft, tname, tcfg, &cp, &in_p[i % sets], &out_p[i % sets])
            })?;
            let ti = kernel_info(&ft, &tname, &tcfg)?;
            let tiled = bench.push(&case, &format!("tiled {k}x{k}"), "events", t, ledger, &[ti]);
            let ncfg = launch::conv_naive_cfg(w, h, c);
            let t = bench.time(iters, |i| {
                launch_kernel!(
                    stream,
                    bl_naive,
                    "conv2d_naive",
                    ncfg,
                    &cp,
                    &in_p[i % sets],
                    &out_p[i % sets]
                )
            })?;
            let ni = kernel_info(bl_naive, "conv2d_naive", &ncfg)?;
            let naive = bench.push(&case, &format!("naive {k}x{k}"), "events", t, ledger, &[ni]);
            // Sanity: tiled and naive agree.
            let mut a = vec![0u8; plane_bytes];
            let mut bb = vec![0u8; plane_bytes];
            launch_kernel!(stream, &ft, tname, tcfg, &cp, &in_p[0], &out_p[0])?;
            stream.memcpy_dtoh(&outs[0], &mut a).map_err(|e| drv_err("bench readback", e))?;
            let out1 = out_p[sets.min(2) - 1];
            launch_kernel!(stream, bl_naive, "conv2d_naive", ncfg, &cp, &in_p[0], &out1)?;
            stream
                .memcpy_dtoh(&outs[sets.min(2) - 1], &mut bb)
                .map_err(|e| drv_err("bench readback", e))?;
            let max = a
                .chunks_exact(4)
                .zip(bb.chunks_exact(4))
                .map(|(x, y)| {
                    (f32::from_le_bytes([x[0], x[1], x[2], x[3]])
                        - f32::from_le_bytes([y[0], y[1], y[2], y[3]]))
                    .abs()
                })
                .fold(0.0f32, f32::max);
            bench.notes.push(format!("conv2d {k}x{k}: tiled {:.1} us vs naive {:.1} us (p50) = {:.2}x; tiled vs naive max |diff| {max:.2e}", tiled.p50, naive.p50, naive.p50 / tiled.p50));
            // Separable path (Gaussian-like outer product), for information.
            let col: Vec<f32> = (0..k).map(|i| 1.0 + i.min(k - 1 - i) as f32).collect();
            let sum: f32 = col.iter().sum();
            let col: Vec<f32> = col.iter().map(|v| v / sum).collect();
            let mut wts = vec![0.0f32; n];
            for r in 0..k as usize {
                for cc in 0..k as usize {
                    wts[r * k as usize + cc] = col[r] * col[cc];
                }
            }
            let sop = Conv2dOp {
                size: k,
                weights: wts,
                separable: Some((col.clone(), col)),
                border: Border::Reflect101,
            };
            bench.b.ensure_conv_constants(&sop)?;
            let fs = bench.b.conv_separable[ki].clone();
            let sname = format!("conv2d_separable_k{k}");
            let t = bench.time(iters, |i| {
                launch_kernel!(stream, &fs, sname, tcfg, &cp, &in_p[i % sets], &out_p[i % sets])
            })?;
            let si = kernel_info(&fs, &sname, &tcfg)?;
            bench.push(&case, &format!("separable {k}x{k}"), "events", t, ledger, &[si]);
        }
        drop((ins, outs));
    }
    let clock_after = measure_clock(bench.b, bl_clock)?;

    // Verdicts on the targets.
    let find = |case: &str, fig: &str| {
        bench.figures.iter().find(|f| f.case.contains(case) && f.figure.starts_with(fig)).cloned()
    };
    let mut verdicts = Vec::new();
    if let (Some(fz), Some(tk)) = (find("3840x2160", "fused"), find("3840x2160", "three-kernel")) {
        let x = tk.p50_us / fz.p50_us;
        verdicts.push(format!(
            "4K fused vs three-kernel: {x:.2}x (target >= 2.4x: {}); ledger ratio {:.2}x",
            if x >= 2.4 { "met" } else { "MISSED" },
            tk.ledger_bytes as f64 / fz.ledger_bytes as f64
        ));
        verdicts.push(format!(
            "4K fused at {:.0} GB/s = {:.0}% of the copy roof (target >= 70%: {})",
            fz.gbps,
            fz.pct_copy_roof,
            if fz.pct_copy_roof >= 70.0 { "met" } else { "MISSED" }
        ));
    }
    if let (Some(t7), Some(n7)) = (find("conv2d", "tiled 7x7"), find("conv2d", "naive 7x7")) {
        let x = n7.p50_us / t7.p50_us;
        verdicts.push(format!(
            "conv2d 7x7 tiled vs naive: {x:.2}x (target >= 2x: {})",
            if x >= 2.0 { "met" } else { "MISSED" }
        ));
    }

    let header = format!(
        "vision_preproc bench — {} ({}, {} SMs, L2 {} MiB, driver {}.{}, NVRTC {}.{}), {}\n\
         SM clock measured {clock_before:.0} MHz before / {clock_after:.0} MHz after (driver max {}); \
         copy roof {:.0} GB/s (read + write); {} timed iterations after {} warm-up per figure\n",
        dev.name, dev.arch, dev.multiprocessors, dev.l2_bytes >> 20, dev.driver_version / 1000,
        (dev.driver_version % 1000) / 10, dev.nvrtc_version.0, dev.nvrtc_version.1, utc(started),
        dev.max_sm_clock_mhz.map_or("n/a".into(), |m| format!("{m:.0} MHz")),
        bench.roof_gbps, iters, opts.warmup
    );
    let mut table = header.clone();
    table.push_str(&format!(
        "{:<58} {:<30} {:>9} {:>9} {:>9} {:>8} {:>7} {:>6} {:>9} {:>8} {:>9} {:>9}\n",
        "case",
        "figure",
        "mean us",
        "p50 us",
        "p99 us",
        "MB",
        "GB/s",
        "%roof",
        "blk/SM",
        "regs",
        "Orin@68",
        "Orin@31"
    ));
    for f in &bench.figures {
        let join = |v: Vec<String>| if v.is_empty() { "-".to_string() } else { v.join("/") };
        table.push_str(&format!(
            "{:<58} {:<30} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>7.0} {:>6.1} {:>9} {:>8} {:>9.1} {:>9.1}\n",
            f.case, f.figure, f.mean_us, f.p50_us, f.p99_us, f.ledger_bytes as f64 / 1e6, f.gbps, f.pct_copy_roof,
            join(f.blocks_per_sm.iter().map(|b| b.to_string()).collect()),
            join(f.registers.iter().map(|r| r.to_string()).collect()),
            f.orin_68gbps_us, f.orin_31gbps_us
        ));
    }
    for n in bench.notes.iter().chain(&verdicts) {
        table.push_str(&format!("* {n}\n"));
    }
    let json = serde_json::json!({
        "device": {
            "name": dev.name, "arch": dev.arch, "multiprocessors": dev.multiprocessors,
            "l2_bytes": dev.l2_bytes, "driver_version": dev.driver_version,
            "nvrtc_version": format!("{}.{}", dev.nvrtc_version.0, dev.nvrtc_version.1),
            "max_sm_clock_mhz": dev.max_sm_clock_mhz,
            "sm_clock_measured_mhz": [clock_before, clock_after],
        },
        "date_utc": utc(started),
        "iterations": iters,
        "warmup": opts.warmup,
        "copy_roof_gbps": bench.roof_gbps,
        "orin_gbps": ORIN_GBPS,
        "figures": bench.figures,
        "frames": opts.frames_dir.as_ref().map_or("random bytes".to_string(), |d| d.display().to_string()),
        "frame_conv": opts.frame_conv,
        "ledgers": ledgers,
        "notes": bench.notes,
        "verdicts": verdicts,
    });
    Ok(BenchReport { json, table })
}

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
        cudarc::driver::result::mem_get_info().map_err(|e| drv_err("cuMemGetInfo", e))?;
    Ok(total.saturating_sub(free) as u64)
}

/// Start-up cost: create the CUDA context (timed on its own), open the backend (kernels
/// from `cache_dir`, compiled and stored there when missing) and process one `width` x
/// `height` rgb8 frame with the default configuration (640x480 letterbox NCHW float32).
/// Returns the breakdown as JSON: milliseconds of each step, whether every module came
/// from the cache, the process's RSS and the device memory in use after each step (and
/// after 100 more frames, the steady state; `since_first_tensor_ms`: from the first tensor
/// to this report, for a caller timing the process from outside). `on_ready` is called with that report while
/// the backend and its CUDA context are still open.
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
        .map_err(|e| drv_err(format!("creating the context of device {device_id}"), e))?;
    let context_ms = t0.elapsed().as_secs_f64() * 1e3;
    ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
    let used_ctx = device_used()?;
    let t1 = Instant::now();
    let mut b = CudaBackend::new_with_cache(device_id, MemoryMode::Auto, cache_dir)?;
    let open_ms = t1.elapsed().as_secs_f64() * 1e3;
    ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
    let used_open = device_used()?;
    let cfg = Config::default();
    let frame = Rng(3).bytes((w * h * 3) as usize);
    let view = ImageView::with_encoding(w, h, w * 3, Encoding::Rgb8, false, &frame)?;
    let g = Geometry::resolve(&cfg, w, h)?;
    let mut op = preprocess_op(&cfg, &g);
    op.params.src_step = w * 3;
    op.params.encoding = Encoding::Rgb8 as u32;
    let mut out = Vec::new();
    let t2 = Instant::now();
    b.process(&view, &op, None, &mut out)?;
    let frame_ms = t2.elapsed().as_secs_f64() * 1e3;
    let first_tensor_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t_first = Instant::now();
    ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
    let used_frame = device_used()?;
    let (rss, hwm) = rss_kb();
    // Steady state: 100 more frames of the same size.
    for _ in 0..100 {
        b.process(&view, &op, None, &mut out)?;
    }
    ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
    let used_steady = device_used()?;
    let (rss_steady, hwm_steady) = rss_kb();
    let mut report = serde_json::json!({
        "frame": format!("{w}x{h} rgb8 -> 640x480 letterbox NCHW float32"),
        "context_ms": context_ms,
        "open_ms": open_ms,
        "kernels": b.loads.iter().map(|l| serde_json::json!({
            "file": l.file, "cached": l.cached, "compile_ms": l.compile_ms,
        })).collect::<Vec<_>>(),
        "cached": b.loads.iter().all(|l| l.cached),
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
