//! One function per figure of the benchmark. Each times one thing on the backend's
//! stream (events; the full frame: wall clock) and records it with its ledger: the bytes
//! that must cross DRAM per iteration, counted from the operation's tables.

use super::baselines::{conv_naive_cfg, linear_cfg, Baselines};
use super::timing::{drv, kernel_info, max_abs_diff_f32, ptr, Bench};
use super::{BenchOptions, FUSED_VARIANTS};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use std::time::Instant;
use vision_preproc::backend::cuda::launch::{self, Conv2dParams};
use vision_preproc::backend::cuda::memory::{PinnedBuffer, PinnedKind, SRC_SLACK};
use vision_preproc::backend::cuda::{kernels, launch_kernel, resident_blocks, CudaBackend};
use vision_preproc::backend::{Backend, Conv2dOp, FrameWork, PreprocessOp, PreprocessParams};
use vision_preproc::config::{
    Border, Config, ConvConfig, ConvKernel, DType, Layout, MemoryMode, ResizeMode,
};
use vision_preproc::error::{CudaError, Result};
use vision_preproc::percentile::Summary;
use vision_preproc::pipeline::{conv_op, preprocess_op, Geometry};
use vision_preproc::rng::SplitMix64;
use vision_preproc::{Encoding, Error, ImageView};

/// A frame size the benchmark times.
pub struct SizeCase {
    /// Label of every figure of the case.
    pub name: String,
    enc: Encoding,
    src: (u32, u32),
    cfg: Config,
}

/// The frame size cases, by index: the Orin reference, the Isaac ROS encoder's, 4K.
pub fn size_cases() -> Vec<SizeCase> {
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

/// Sets of buffers of `footprint` bytes needed so that rotating over them defeats L2.
fn rotation(footprint: u64, l2: i32) -> usize {
    (4 * u64::from(l2.max(0) as u32)).div_ceil(footprint.max(1)).clamp(1, 32) as usize
}

/// Case `index`'s frame of `frame_bytes` bytes: read from `--frames`'s `case<index>.raw`
/// (which must hold exactly that many), or drawn from `rng`.
fn case_frame(
    opts: &BenchOptions,
    index: usize,
    frame_bytes: usize,
    (sw, sh): (u32, u32),
    rng: &mut SplitMix64,
) -> Result<Vec<u8>> {
    let Some(dir) = &opts.frames_dir else {
        return Ok(rng.bytes(frame_bytes));
    };
    let path = dir.join(format!("case{index}.raw"));
    let v =
        std::fs::read(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if v.len() != frame_bytes {
        return Err(Error::config(
            "frames",
            path.display(),
            format!(
                "case {index} needs exactly {frame_bytes} bytes ({sw}x{sh}x3), got {}",
                v.len()
            ),
        ));
    }
    Ok(v)
}

/// A case's rotating device frames and tensors.
type DeviceSets = (Vec<CudaSlice<u8>>, Vec<CudaSlice<u8>>);

/// `sets` rotating pairs of device buffers: a frame (with the kernels' read-ahead slack)
/// holding `fixed`, or fresh bytes from `rng` for each set, and a tensor.
fn device_sets(
    bench: &Bench<'_>,
    sets: usize,
    (frame_bytes, out_bytes): (usize, usize),
    fixed: Option<&[u8]>,
    rng: &mut SplitMix64,
) -> Result<DeviceSets> {
    let mut srcs = Vec::new();
    let mut dsts = Vec::new();
    for _ in 0..sets {
        let mut s = bench.alloc(frame_bytes + SRC_SLACK, "frames")?;
        match fixed {
            Some(frame) => bench.upload(&mut s, frame)?,
            None => bench.upload(&mut s, &rng.bytes(frame_bytes))?,
        }
        srcs.push(s);
        dsts.push(bench.alloc(out_bytes, "tensors")?);
    }
    Ok((srcs, dsts))
}

/// `n` zeroed device buffers of `bytes` bytes each, and their addresses.
fn device_buffers(
    bench: &Bench<'_>,
    n: usize,
    bytes: usize,
    what: &str,
) -> Result<(Vec<CudaSlice<u8>>, Vec<CUdeviceptr>)> {
    let bufs = (0..n).map(|_| bench.alloc(bytes, what)).collect::<Result<Vec<_>, _>>()?;
    let ptrs = bufs.iter().map(|s| ptr(s, bench.b)).collect();
    Ok((bufs, ptrs))
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
    c.conv = ConvConfig {
        kernel: ConvKernel::Gaussian,
        size: k,
        sigma: 0.0,
        weights: Vec::new(),
        border: Border::Constant,
    };
    conv_op(&c)
}

/// Everything a case's figures share: the operation, its frame, rotating sets of device
/// frames and tensors, and the fused kernel's launch.
pub struct Case {
    /// `SizeCase::name`.
    pub name: String,
    /// Index in [`size_cases`].
    pub index: usize,
    enc: Encoding,
    resize_mode: ResizeMode,
    op: PreprocessOp,
    p: PreprocessParams,
    frame: Vec<u8>,
    step: u32,
    frame_bytes: usize,
    out_bytes: usize,
    maps_bytes: u64,
    /// Bytes of the fused kernel's ledger.
    pub fused_ledger: u64,
    /// The conv2d of the frame figures (`--frame-conv`).
    pub conv: Option<Conv2dOp>,
    sets: usize,
    /// The device frames behind `src_p` (owned here, only read through the pointers).
    _srcs: Vec<CudaSlice<u8>>,
    dsts: Vec<CudaSlice<u8>>,
    src_p: Vec<CUdeviceptr>,
    dst_p: Vec<CUdeviceptr>,
    maps: CUdeviceptr,
    fused: CudaFunction,
    fused_name: String,
    fused_cfg: LaunchConfig,
}

/// The staged path's row words: the benchmark times the backend's default, the direct
/// path (no shared-memory window).
const DIRECT: u32 = 0;

/// The backend's fused kernel for `enc` and its default launch for `p` (the direct path,
/// as many resident blocks as the device holds).
fn fused_launch(
    b: &CudaBackend,
    enc: Encoding,
    p: &PreprocessParams,
) -> (CudaFunction, String, LaunchConfig) {
    let (f, name) = b.fused_kernel(enc);
    let sms = b.device().multiprocessors;
    let cfg = launch::resize_normalize_cfg(p, DIRECT, resident_blocks(f, DIRECT, sms));
    (f.clone(), name.to_string(), cfg)
}

impl Case {
    /// Resolve `sc`'s operation, read or draw its frame, run it once through the backend
    /// (which uploads the tables and sizes its buffers) and allocate the rotating sets.
    pub fn prepare(
        bench: &mut Bench<'_>,
        index: usize,
        sc: SizeCase,
        opts: &BenchOptions,
        rng: &mut SplitMix64,
    ) -> Result<Case> {
        let (sw, sh) = sc.src;
        let step = sw * sc.enc.bytes_per_pixel();
        let frame_bytes = (step * sh) as usize;
        let g = Geometry::resolve(&sc.cfg, sw, sh)?;
        let mut op = preprocess_op(&sc.cfg, &g);
        op.params.src_step = step;
        op.params.encoding = sc.enc as u32;
        let p = op.params;
        let out_bytes = p.tensor_desc().byte_len();
        let maps_bytes = 12 * (op.x_map.i0.len() + op.y_map.i0.len()) as u64;
        let fused_ledger =
            source_ledger(&op, sc.enc.bytes_per_pixel()) + out_bytes as u64 + maps_bytes;
        let l2 = bench.b.device().l2_bytes;
        let sets = rotation(frame_bytes as u64 + out_bytes as u64, l2);
        let frame = case_frame(opts, index, frame_bytes, sc.src, rng)?;
        let conv = frame_conv_op(opts.frame_conv, &sc.cfg)?;
        let view = ImageView::with_encoding(sw, sh, step, sc.enc, false, &frame)?;
        let mut out = Vec::new();
        bench.b.process(FrameWork::new(&view, &op, None), &mut out)?;
        let maps =
            bench.b.tables_device_ptr().ok_or_else(|| drv("bench", "tables not uploaded"))?;
        let fixed = opts.frames_dir.is_some().then_some(&frame[..]);
        let (srcs, dsts) = device_sets(bench, sets, (frame_bytes, out_bytes), fixed, rng)?;
        let src_p = srcs.iter().map(|s| ptr(s, bench.b)).collect();
        let dst_p = dsts.iter().map(|s| ptr(s, bench.b)).collect();
        let (fused, fused_name, fused_cfg) = fused_launch(bench.b, sc.enc, &p);
        Ok(Case {
            name: sc.name,
            index,
            enc: sc.enc,
            resize_mode: sc.cfg.resize_mode,
            op,
            p,
            frame,
            step,
            frame_bytes,
            out_bytes,
            maps_bytes,
            fused_ledger,
            conv,
            sets,
            _srcs: srcs,
            dsts,
            src_p,
            dst_p,
            maps,
            fused,
            fused_name,
            fused_cfg,
        })
    }

    fn view(&self) -> Result<ImageView<'_>> {
        let (w, h) = (self.p.src_width, self.p.src_height);
        Ok(ImageView::with_encoding(w, h, self.step, self.enc, false, &self.frame)?)
    }

    /// Launch the fused kernel (the backend's default launch) from set `i`.
    fn launch_fused(
        &self,
        b: &CudaBackend,
        s: CUdeviceptr,
        d: CUdeviceptr,
    ) -> Result<(), CudaError> {
        let (p, maps, words) = (&self.p, &self.maps, &DIRECT);
        launch_kernel!(
            b.stream(),
            &self.fused,
            self.fused_name,
            self.fused_cfg,
            p,
            &s,
            maps,
            &d,
            words
        )
    }

    /// The case's byte counts for results.json.
    pub fn ledger_json(&self) -> serde_json::Value {
        let (frame, out) = (self.frame_bytes as u64, self.out_bytes as u64);
        let conv_ledger = self.conv_ledger();
        serde_json::json!({
            "case": self.name, "frame_bytes": self.frame_bytes, "tensor_bytes": self.out_bytes,
            "fused": self.fused_ledger, "conv2d": conv_ledger,
            "conv_size": self.conv.as_ref().map_or(0, |c| c.size),
            "conv_weights": self.conv.as_ref().map(|c| c.weights.clone()),
            "gpu_frame_discrete": 2 * frame + self.fused_ledger + conv_ledger + 2 * out,
            "jetson_mapped_frame_kernels": self.fused_ledger + conv_ledger,
            "jetson_mapped_frame_with_cpu_copies": self.fused_ledger + conv_ledger + 2 * frame + 2 * out,
        })
    }

    fn conv_ledger(&self) -> u64 {
        if self.conv.is_some() {
            2 * self.out_bytes as u64
        } else {
            0
        }
    }
}

/// The roof: a device-to-device copy of 4x L2 (at least 256 MiB), read + write bytes.
/// Sets `bench.roof_gbps`, against which every figure's bandwidth is given.
pub fn copy_roof(bench: &mut Bench<'_>, rng: &mut SplitMix64) -> Result<()> {
    let roof_bytes = (4 * bench.b.device().l2_bytes.max(0) as usize).max(256 << 20);
    let mut roof_src = bench.alloc(roof_bytes, "the copy roof")?;
    let roof_dst = bench.alloc(roof_bytes, "the copy roof")?;
    let fill = rng.bytes(roof_bytes);
    bench.upload(&mut roof_src, &fill)?;
    drop(fill);
    let (rs, rd) = (ptr(&roof_src, bench.b), ptr(&roof_dst, bench.b));
    let cu_stream = bench.b.stream().cu_stream();
    let t = bench.time(bench.iters.min(200), |_| {
        // SAFETY: both buffers have roof_bytes bytes and live until the end of this scope.
        unsafe { sys::cuMemcpyDtoDAsync_v2(rd, rs, roof_bytes, cu_stream) }
            .result()
            .map_err(|e| drv("copy roof", e))
    })?;
    let p50 = Summary::of(&t).map_or(f64::NAN, |s| s.p50);
    bench.roof_gbps = 2.0 * roof_bytes as f64 / (p50 * 1e-6) / 1e9;
    bench.push(
        "device",
        &format!("copy roof ({} MiB dtod)", roof_bytes >> 20),
        "events",
        vec![p50],
        2 * roof_bytes as u64,
        &[],
    );
    Ok(())
}

/// The fused kernel alone, as the backend launches it (direct path, resident blocks).
pub fn fused(bench: &mut Bench<'_>, case: &Case) -> Result<Summary> {
    let t = bench.time(bench.iters, |i| {
        case.launch_fused(bench.b, case.src_p[i % case.sets], case.dst_p[i % case.sets])
    })?;
    let info = kernel_info(&case.fused, &case.fused_name, &case.fused_cfg)?;
    Ok(bench.push(&case.name, "fused (direct)", "events", t, case.fused_ledger, &[info]))
}

/// The fused kernel with one block per tile (a partial last wave) instead of resident
/// persistent blocks.
pub fn fused_one_block_per_tile(bench: &mut Bench<'_>, case: &Case) -> Result<()> {
    let all = launch::resize_normalize_cfg(&case.p, DIRECT, u32::MAX);
    let stream = bench.b.stream().clone();
    let (p, f, name, maps) = (&case.p, &case.fused, &case.fused_name, &case.maps);
    let t = bench.time(bench.iters, |i| {
        let (s, d) = (case.src_p[i % case.sets], case.dst_p[i % case.sets]);
        launch_kernel!(stream, f, name, all, p, &s, maps, &d, &DIRECT)
    })?;
    let info = kernel_info(f, name, &all)?;
    bench.push(&case.name, "variant one block per tile", "events", t, case.fused_ledger, &[info]);
    Ok(())
}

/// Compile-time variants of the fused kernel ([`FUSED_VARIANTS`]), each checked to
/// compute the default's tensor bit for bit.
pub fn fused_variants(bench: &mut Bench<'_>, case: &Case) -> Result<()> {
    let arch = bench.b.device().arch.clone();
    let sms = bench.b.device().multiprocessors;
    let stream = bench.b.stream().clone();
    let (p, name, maps) = (&case.p, &case.fused_name, &case.maps);
    for (label, extra, staged) in FUSED_VARIANTS {
        let mut o = kernels::compile_options(&arch);
        o.extend(extra.iter().map(|e| e.to_string()));
        let c = kernels::compile_with_options(kernels::KernelFile::ResizeNormalize, &arch, &o)?;
        let m = bench
            .b
            .context()
            .load_module(cudarc::nvrtc::Ptx::from_binary(c.cubin))
            .map_err(|e| drv(format!("loading {label}"), e))?;
        let vf = m.load_function(name).map_err(|e| drv(format!("{name} in {label}"), e))?;
        let vw = if staged { launch::staged_row_words(p, &case.op.x_map, case.enc) } else { 0 };
        let vcfg = launch::resize_normalize_cfg(p, vw, resident_blocks(&vf, vw, sms));
        let t = bench.time(bench.iters, |i| {
            let (s, d) = (case.src_p[i % case.sets], case.dst_p[i % case.sets]);
            launch_kernel!(stream, &vf, name, vcfg, p, &s, maps, &d, &vw)
        })?;
        let info = kernel_info(&vf, name, &vcfg)?;
        let label = if staged && vw == 0 {
            format!("{label} [window too wide: direct]")
        } else {
            label.to_string()
        };
        bench.push(&case.name, &label, "events", t, case.fused_ledger, &[info]);
        // The variant must compute the same tensor, bit for bit.
        let (s0, d0, d1) = (case.src_p[0], case.dst_p[0], case.dst_p[1 % case.sets]);
        launch_kernel!(stream, &vf, name, vcfg, p, &s0, maps, &d0, &vw)?;
        case.launch_fused(bench.b, s0, d1)?;
        let mut a = vec![0u8; case.out_bytes];
        let mut bb = vec![0u8; case.out_bytes];
        bench.download(&case.dsts[0], &mut a)?;
        bench.download(&case.dsts[1 % case.sets], &mut bb)?;
        bench.notes.push(format!(
            "{}: {label}: output {} the default's",
            case.name,
            if a == bb { "bit-identical to" } else { "DIFFERS from" }
        ));
    }
    Ok(())
}

/// The three-kernel path the fused kernel replaces (resize u8 -> normalize f32 HWC ->
/// CHW), compared with `fused`; for stretch cases also checked against the fused tensor.
pub fn three_kernel(
    bench: &mut Bench<'_>,
    case: &Case,
    bl: &Baselines,
    fused: Summary,
) -> Result<()> {
    let p = &case.p;
    let npx = (p.dst_width * p.dst_height) as usize;
    let tmp_u8 = bench.alloc(npx * 3, "three-kernel u8")?;
    let tmp_f32 = bench.alloc(npx * 12, "three-kernel f32 HWC")?;
    let (tu8, tf32) = (ptr(&tmp_u8, bench.b), ptr(&tmp_f32, bench.b));
    let c1 = linear_cfg(npx as u32);
    let c3 = linear_cfg(npx as u32 * 3);
    let stream = bench.b.stream().clone();
    let maps = &case.maps;
    let three = |i: usize| -> Result<(), CudaError> {
        let (s, d) = (case.src_p[i % case.sets], case.dst_p[i % case.sets]);
        launch_kernel!(stream, &bl.resize, "baseline_resize_rgb8", c1, p, &s, maps, &tu8)?;
        launch_kernel!(stream, &bl.normalize, "baseline_normalize_hwc", c3, p, &tu8, &tf32)?;
        launch_kernel!(stream, &bl.hwc_to_chw, "baseline_hwc_to_chw", c3, p, &tf32, &d)
    };
    let t = bench.time(bench.iters, three)?;
    let three_ledger = source_ledger(&case.op, 3)
        + case.maps_bytes
        + 2 * (npx * 3) as u64
        + 2 * (npx * 12) as u64
        + case.out_bytes as u64;
    let infos = [
        kernel_info(&bl.resize, "baseline_resize_rgb8", &c1)?,
        kernel_info(&bl.normalize, "baseline_normalize_hwc", &c3)?,
        kernel_info(&bl.hwc_to_chw, "baseline_hwc_to_chw", &c3)?,
    ];
    let threek = bench.push(&case.name, "three-kernel", "events", t, three_ledger, &infos);
    let fl = case.fused_ledger as f64;
    bench.notes.push(format!(
        "{}: fused {:.1} us vs three-kernel {:.1} us (p50) = {:.2}x; the ledger predicts {:.2}x ({:.2} MB vs {:.2} MB)",
        case.name, fused.p50, threek.p50, threek.p50 / fused.p50, three_ledger as f64 / fl,
        fl / 1e6, three_ledger as f64 / 1e6
    ));
    // Sanity: the baseline computes about the same tensor (u8 rounding in between).
    if case.resize_mode == ResizeMode::Stretch {
        let mut a = vec![0u8; case.out_bytes];
        let mut bb = vec![0u8; case.out_bytes];
        three(0)?;
        case.launch_fused(bench.b, case.src_p[0], tf32)?;
        bench.download(&case.dsts[0], &mut a)?;
        bench.download(&tmp_f32, &mut bb)?;
        let max = max_abs_diff_f32(&a, &bb);
        bench.notes.push(format!("{}: three-kernel vs fused output max |diff| {max:.4} (expected <= 0.5/255/0.5 = 0.0039 from the u8 rounding)", case.name));
    }
    Ok(())
}

/// Pinned host buffers of a case's frame and tensor, as the backend's `upload` mode uses.
pub struct HostBuffers {
    up: PinnedBuffer,
    down: PinnedBuffer,
}

/// Upload (pinned write-combined -> device) and download (device -> pinned cached) of
/// one frame and one tensor; returns the pinned buffers for the GPU frame figures.
pub fn upload_download(bench: &mut Bench<'_>, case: &Case) -> Result<HostBuffers> {
    let (frame_bytes, out_bytes) = (case.frame_bytes, case.out_bytes);
    let mut up = PinnedBuffer::new(bench.b.context(), frame_bytes, PinnedKind::Upload)?;
    // SAFETY: freshly allocated, no GPU work uses it yet.
    unsafe { up.host_mut()[..frame_bytes].copy_from_slice(&case.frame) };
    let down = PinnedBuffer::new(bench.b.context(), out_bytes, PinnedKind::Download)?;
    let (uh, dh) = (up.host_ptr(), down.host_ptr());
    let cu_stream = bench.b.stream().cu_stream();
    let t = bench.time(bench.iters, |i| {
        // SAFETY: uh holds frame_bytes bytes, the device set at least as many; both
        // outlive the synchronize at the end of `time`.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                case.src_p[i % case.sets],
                uh as *const _,
                frame_bytes,
                cu_stream,
            )
        }
        .result()
        .map_err(|e| drv("upload", e))
    })?;
    bench.push(
        &case.name,
        "upload (pinned WC -> device)",
        "events",
        t,
        frame_bytes as u64 * 2,
        &[],
    );
    let t = bench.time(bench.iters, |i| {
        // SAFETY: as above, for out_bytes into the cached pinned buffer.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(dh as *mut _, case.dst_p[i % case.sets], out_bytes, cu_stream)
        }
        .result()
        .map_err(|e| drv("download", e))
    })?;
    bench.push(&case.name, "download (device -> pinned)", "events", t, out_bytes as u64 * 2, &[]);
    Ok(HostBuffers { up, down })
}

/// The GPU frame: upload + fused + conv2d + download on the stream, events around the
/// four (the work a PyTorch pipeline on the same frame does; no CPU copies); with a
/// conv2d also the conv2d alone and fused + conv2d; and the frame without conv2d.
pub fn gpu_frame(bench: &mut Bench<'_>, case: &Case, host: &HostBuffers) -> Result<()> {
    let (frame_bytes, out_bytes) = (case.frame_bytes, case.out_bytes);
    let (uh, dh) = (host.up.host_ptr(), host.down.host_ptr());
    let cu_stream = bench.b.stream().cu_stream();
    let upload = |s: CUdeviceptr| -> Result<(), CudaError> {
        // SAFETY: uh holds frame_bytes bytes and every device frame of the case at least
        // as many; both outlive the synchronize at the end of `time`.
        unsafe { sys::cuMemcpyHtoDAsync_v2(s, uh as *const _, frame_bytes, cu_stream) }
            .result()
            .map_err(|e| drv("upload", e))
    };
    let download = |d: CUdeviceptr| -> Result<(), CudaError> {
        // SAFETY: dh holds out_bytes bytes and every device tensor of the case as many;
        // both outlive the synchronize at the end of `time`.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dh as *mut _, d, out_bytes, cu_stream) }
            .result()
            .map_err(|e| drv("download", e))
    };
    if let Some(c) = &case.conv {
        gpu_frame_conv(bench, case, c, &upload, &download)?;
    }
    let t = bench.time(bench.iters, |i| {
        let (s, d) = (case.src_p[i % case.sets], case.dst_p[i % case.sets]);
        upload(s)?;
        case.launch_fused(bench.b, s, d)?;
        download(d)
    })?;
    bench.push(
        &case.name,
        "GPU frame without conv2d (upload + fused + download)",
        "events",
        t,
        2 * frame_bytes as u64 + case.fused_ledger + 2 * out_bytes as u64,
        &[],
    );
    Ok(())
}

/// The GPU frame's figures with `case`'s conv2d `c`: conv2d alone, fused + conv2d, and the
/// whole frame (`upload` and `download` move one set's frame and tensor).
fn gpu_frame_conv(
    bench: &mut Bench<'_>,
    case: &Case,
    c: &Conv2dOp,
    upload: &dyn Fn(CUdeviceptr) -> Result<(), CudaError>,
    download: &dyn Fn(CUdeviceptr) -> Result<(), CudaError>,
) -> Result<()> {
    let (frame_bytes, out_bytes) = (case.frame_bytes, case.out_bytes);
    let stream = bench.b.stream().clone();
    let conv_ledger = case.conv_ledger();
    bench.b.ensure_conv_constants(c)?;
    // The conv2d's input: one scratch tensor per set (kept alive here, used through `scr_p`).
    let (_scratch, scr_p) = device_buffers(bench, case.sets, out_bytes, "conv2d input")?;
    let (cp, fc, cname) = bench.b.conv_launch(&case.p, c);
    let fc = fc.clone();
    let ccfg = launch::conv_tiled_cfg(case.p.dst_width, case.p.dst_height);
    let fi = kernel_info(&case.fused, &case.fused_name, &case.fused_cfg)?;
    let ci = kernel_info(&fc, &cname, &ccfg)?;
    // Conv2d alone, then fused + conv2d, then the whole GPU frame.
    let t = bench.time(bench.iters, |i| {
        let (sc, d) = (scr_p[i % case.sets], case.dst_p[i % case.sets]);
        launch_kernel!(stream, &fc, cname, ccfg, &cp, &sc, &d)
    })?;
    let what = format!("conv2d {}x{} gaussian", c.size, c.size);
    bench.push(&case.name, &what, "events", t, conv_ledger, std::slice::from_ref(&ci));
    let t = bench.time(bench.iters, |i| {
        let (s, sc, d) =
            (case.src_p[i % case.sets], scr_p[i % case.sets], case.dst_p[i % case.sets]);
        case.launch_fused(bench.b, s, sc)?;
        launch_kernel!(stream, &fc, cname, ccfg, &cp, &sc, &d)
    })?;
    let infos = [fi.clone(), ci.clone()];
    bench.push(
        &case.name,
        "fused + conv2d (device only)",
        "events",
        t,
        case.fused_ledger + conv_ledger,
        &infos,
    );
    let t = bench.time(bench.iters, |i| {
        let (s, sc, d) =
            (case.src_p[i % case.sets], scr_p[i % case.sets], case.dst_p[i % case.sets]);
        upload(s)?;
        case.launch_fused(bench.b, s, sc)?;
        launch_kernel!(stream, &fc, cname, ccfg, &cp, &sc, &d)?;
        download(d)
    })?;
    bench.push(
        &case.name,
        "GPU frame (upload + fused + conv2d + download)",
        "events",
        t,
        2 * frame_bytes as u64 + case.fused_ledger + conv_ledger + 2 * out_bytes as u64,
        &[fi, ci],
    );
    Ok(())
}

/// The full frame through the backend (CPU copies into and out of pinned memory
/// included), in both memory modes, wall clock. Ledger: the Jetson's mapped path, frame
/// copied in (read + write), read by the kernel, tensor written, copied out. With
/// `--frames`, first writes the backend's tensor of the frame to `DIR/case<i>.tensor`.
pub fn full_frame(bench: &mut Bench<'_>, case: &Case, opts: &BenchOptions) -> Result<()> {
    let full_ledger = 3 * case.frame_bytes as u64 + 3 * case.out_bytes as u64 + case.conv_ledger();
    let view = case.view()?;
    let conv = case.conv.as_ref();
    let mut out = Vec::new();
    if let Some(dir) = &opts.frames_dir {
        // The tensor another program compares against: this frame through the backend.
        bench.b.process(FrameWork::new(&view, &case.op, conv), &mut out)?;
        let path = dir.join(format!("case{}.tensor", case.index));
        std::fs::write(&path, &out)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    }
    let with = if conv.is_some() { " + conv2d" } else { "" };
    let (warmup, iters) = (bench.warmup, bench.iters);
    let mut wall = |b: &mut CudaBackend| -> Result<Vec<f64>> {
        let mut v = Vec::with_capacity(iters);
        for i in 0..warmup + iters {
            let t0 = Instant::now();
            b.process(FrameWork::new(&view, &case.op, conv), &mut out)?;
            if i >= warmup {
                v.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(v)
    };
    let t = wall(bench.b)?;
    bench.push(
        &case.name,
        &format!("full frame{with}, upload mode"),
        "wall clock",
        t,
        full_ledger,
        &[],
    );
    let mut mapped = CudaBackend::new(bench.b.device().ordinal, MemoryMode::Mapped)?;
    let t = wall(&mut mapped)?;
    bench.push(
        &case.name,
        &format!("full frame{with}, mapped mode"),
        "wall clock",
        t,
        full_ledger,
        &[],
    );
    Ok(())
}

/// The conv2d input of [`conv2d`]: rotating sets of 1920x1080x3 float32 NCHW planes.
pub struct ConvPlanes {
    /// The device planes behind `in_p` (owned here, only read through the pointers).
    _ins: Vec<CudaSlice<u8>>,
    outs: Vec<CudaSlice<u8>>,
    in_p: Vec<CUdeviceptr>,
    out_p: Vec<CUdeviceptr>,
    sets: usize,
}

/// The conv2d figures' image.
const CONV_IMAGE: (u32, u32, u32) = (1920, 1080, 3);

impl ConvPlanes {
    /// Random planes (values in [-2, 2)), enough sets to defeat L2.
    pub fn new(bench: &Bench<'_>, rng: &mut SplitMix64) -> Result<Self> {
        let (w, h, c) = CONV_IMAGE;
        let plane_bytes = (w * h * c) as usize * 4;
        let sets = rotation(2 * plane_bytes as u64, bench.b.device().l2_bytes);
        let (mut ins, mut outs) = (Vec::new(), Vec::new());
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
        let in_p = ins.iter().map(|s| ptr(s, bench.b)).collect();
        let out_p = outs.iter().map(|s| ptr(s, bench.b)).collect();
        Ok(ConvPlanes { _ins: ins, outs, in_p, out_p, sets })
    }
}

/// conv2d `k`x`k` on 1920x1080x3 float32 (NCHW in, NCHW f32 out), reflect101 border:
/// the tiled kernel against the naive one (checked to agree), then the separable one.
pub fn conv2d(
    bench: &mut Bench<'_>,
    bl: &Baselines,
    planes: &ConvPlanes,
    k: u32,
    rng: &mut SplitMix64,
) -> Result<()> {
    let n = (k * k) as usize;
    let weights: Vec<f32> = rng.bytes(n).iter().map(|&b| f32::from(b) / 255.0 - 0.5).collect();
    let op =
        Conv2dOp { size: k, weights: weights.clone(), separable: None, border: Border::Reflect101 };
    bench.b.ensure_conv_constants(&op)?;
    bl.set_naive_weights(bench.b, &weights)?;
    conv2d_tiled_naive(bench, bl, planes, k)?;
    conv2d_separable(bench, planes, k)
}

/// The conv2d figures' case name.
const CONV_CASE: &str = "conv2d 1920x1080x3 float32, reflect101";

/// The parameters of a `k`x`k` conv2d over [`CONV_IMAGE`].
fn conv_params(k: u32) -> Conv2dParams {
    let (w, h, c) = CONV_IMAGE;
    Conv2dParams {
        width: w,
        height: h,
        channels: c,
        size: k,
        border: Border::Reflect101,
        layout: Layout::Nchw,
        dtype: DType::Float32,
        skip: 0,
    }
}

/// The tiled and the naive conv2d with the weights set, timed, and a note comparing them
/// (times and the largest difference of their outputs).
fn conv2d_tiled_naive(
    bench: &mut Bench<'_>,
    bl: &Baselines,
    planes: &ConvPlanes,
    k: u32,
) -> Result<()> {
    let (w, h, c) = CONV_IMAGE;
    let plane_bytes = (w * h * c) as usize * 4;
    let ledger = 2 * plane_bytes as u64;
    let stream = bench.b.stream().clone();
    let (in_p, out_p, sets) = (&planes.in_p, &planes.out_p, planes.sets);
    let cp = conv_params(k);
    let (ft, tname) = bench.b.conv_kernel(k, false);
    let ft = ft.clone();
    let tcfg = launch::conv_tiled_cfg(w, h);
    let t = bench.time(bench.iters, |i| {
        launch_kernel!(stream, &ft, tname, tcfg, &cp, &in_p[i % sets], &out_p[i % sets])
    })?;
    let ti = kernel_info(&ft, &tname, &tcfg)?;
    let tiled = bench.push(CONV_CASE, &format!("tiled {k}x{k}"), "events", t, ledger, &[ti]);
    let ncfg = conv_naive_cfg(w, h, c);
    let t = bench.time(bench.iters, |i| {
        launch_kernel!(
            stream,
            &bl.conv_naive,
            "conv2d_naive",
            ncfg,
            &cp,
            &in_p[i % sets],
            &out_p[i % sets]
        )
    })?;
    let ni = kernel_info(&bl.conv_naive, "conv2d_naive", &ncfg)?;
    let naive = bench.push(CONV_CASE, &format!("naive {k}x{k}"), "events", t, ledger, &[ni]);
    // Sanity: tiled and naive agree.
    let mut a = vec![0u8; plane_bytes];
    let mut bb = vec![0u8; plane_bytes];
    launch_kernel!(stream, &ft, tname, tcfg, &cp, &in_p[0], &out_p[0])?;
    bench.download(&planes.outs[0], &mut a)?;
    let last = sets.min(2) - 1;
    launch_kernel!(stream, &bl.conv_naive, "conv2d_naive", ncfg, &cp, &in_p[0], &out_p[last])?;
    bench.download(&planes.outs[last], &mut bb)?;
    let max = max_abs_diff_f32(&a, &bb);
    bench.notes.push(format!("conv2d {k}x{k}: tiled {:.1} us vs naive {:.1} us (p50) = {:.2}x; tiled vs naive max |diff| {max:.2e}", tiled.p50, naive.p50, naive.p50 / tiled.p50));
    Ok(())
}

/// The separable conv2d (a Gaussian-like outer product), for information.
fn conv2d_separable(bench: &mut Bench<'_>, planes: &ConvPlanes, k: u32) -> Result<()> {
    let (w, h, c) = CONV_IMAGE;
    let ledger = 2 * ((w * h * c) as usize * 4) as u64;
    let stream = bench.b.stream().clone();
    let (in_p, out_p, sets) = (&planes.in_p, &planes.out_p, planes.sets);
    let cp = conv_params(k);
    let tcfg = launch::conv_tiled_cfg(w, h);
    let col: Vec<f32> = (0..k).map(|i| 1.0 + i.min(k - 1 - i) as f32).collect();
    let sum: f32 = col.iter().sum();
    let col: Vec<f32> = col.iter().map(|v| v / sum).collect();
    let mut wts = vec![0.0f32; (k * k) as usize];
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
    let (fs, sname) = bench.b.conv_kernel(k, true);
    let fs = fs.clone();
    let t = bench.time(bench.iters, |i| {
        launch_kernel!(stream, &fs, sname, tcfg, &cp, &in_p[i % sets], &out_p[i % sets])
    })?;
    let si = kernel_info(&fs, &sname, &tcfg)?;
    bench.push(CONV_CASE, &format!("separable {k}x{k}"), "events", t, ledger, &[si]);
    Ok(())
}
