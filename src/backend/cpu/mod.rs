//! The CPU backend: the specification of what vision_preproc computes, and a fast
//! implementation of it.
//!
//! The function is defined per output element by [`reference::element`] (decode the
//! four source samples, blend horizontally then vertically like `cv2.resize`, normalize).
//! The fast pass here computes the same arithmetic, in the same order, bit for bit (a
//! test checks every encoding, mode and layout against the reference), organised for
//! speed:
//!
//! - output rows in bands, bands in parallel (rayon); each band owns its output bytes and
//!   a scratch of a few rows, reused across frames (no allocation per row);
//! - the horizontal blend of a source row is computed once and kept while consecutive
//!   output rows use it (OpenCV's order: horizontal pass, then vertical);
//! - one `match` on the encoding per frame (`decode::with_source`): the loops are
//!   monomorphised per encoding and channel count; the taps of a row are decoded in
//!   blocks (YUV: the integer formula over arrays), the blends, normalization and store
//!   are plain slice loops: the compiler vectorizes them;
//! - on x86-64 the band loop is also compiled for AVX2 and chosen at run time
//!   ([`Simd`]); the values are the same (no fused multiply-add, exact integers);
//! - on aarch64 the band loop's inner loops are written with NEON intrinsics
//!   (`neon.rs`: the blends, the packed-8-bit taps, the f16 store), chosen at run time
//!   like AVX2; the same IEEE operations in the same order, so the same values;
//! - taps of weight 0 (nearest; integer downscale factors such as 1920 -> 640) are not
//!   read: `a * (1 - 0) + b * 0 == a` exactly, so this changes no value;
//! - no intermediate full-size image: every sample is decoded from the source bytes.

mod conv;
pub(crate) mod decode;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod reference;

pub use conv::{conv2d, ConvScratch};

use crate::backend::{
    AxisMap, Backend, BatchWork, Frame as Input, FrameWork, HostPixels, PreprocessOp,
    PreprocessParams, StageTimes,
};
use crate::config::{DType, Layout};
use crate::error::Result;
use crate::image::ImageView;
use crate::nvtx::{self, Stage};
use decode::{with_source, Source};
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use std::time::Instant;

/// The CPU backend (rayon's global thread pool).
#[derive(Debug)]
pub struct CpuBackend {
    bands: Vec<Scratch>,
    /// The normalized f32 tensor, when conv2d runs on it before the dtype conversion.
    scratch: Vec<f32>,
    conv_scratch: conv::ConvScratch,
    simd: Simd,
    /// One backend per batch slot, so that the slots of a batch run in parallel.
    slots: Vec<CpuBackend>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend {
            bands: Vec::new(),
            scratch: Vec::new(),
            conv_scratch: conv::ConvScratch::default(),
            simd: Simd::detect(),
            slots: Vec::new(),
        }
    }
}

impl CpuBackend {
    /// A CPU backend using rayon's global pool and the best instruction set of the CPU.
    pub fn new() -> Self {
        CpuBackend::default()
    }

    /// Choose the build of the inner loops (the values are the same; tests run both).
    /// `Simd::Avx2` and `Simd::Neon` fall back to the baseline on a CPU (or target)
    /// without them.
    pub fn set_simd(&mut self, simd: Simd) {
        self.simd = if simd == Simd::detect() { simd } else { Simd::Baseline };
    }

    /// The build of the inner loops in use.
    pub fn simd(&self) -> Simd {
        self.simd
    }

    /// The fused pass: decode, resample, pad, normalize and store `op`'s tensor
    /// (`op.params.tensor_desc()`, little-endian) into `out`, resized to fit. The buffer
    /// and this backend's scratch are reused from frame to frame.
    pub fn preprocess(
        &mut self,
        image: &ImageView<'_>,
        op: &PreprocessOp,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        out.resize(op.params.tensor_desc().byte_len(), 0);
        self.preprocess_into(image, op, out)
    }

    /// [`CpuBackend::preprocess`] into `out` of exactly the tensor's byte length.
    pub(crate) fn preprocess_into(
        &mut self,
        image: &ImageView<'_>,
        op: &PreprocessOp,
        out: &mut [u8],
    ) -> Result<()> {
        op.check(image)?;
        crate::backend::check_out_len(op, out.len())?;
        let store = Store::of(op.params.dtype);
        fused(image, op, out, store, self.simd, &mut self.bands);
        Ok(())
    }

    /// The same pass into [`CpuBackend::f32_tensor`]: the normalized tensor as native
    /// f32 in the output layout, before any dtype conversion (for conv2d).
    pub fn preprocess_f32(&mut self, image: &ImageView<'_>, op: &PreprocessOp) -> Result<()> {
        op.check(image)?;
        self.scratch.resize(op.params.tensor_desc().len(), 0.0);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.scratch[..]);
        fused(image, op, bytes, Store::F32Native, self.simd, &mut self.bands);
        Ok(())
    }

    /// The tensor written by [`CpuBackend::preprocess_f32`].
    pub fn f32_tensor(&mut self) -> &mut [f32] {
        &mut self.scratch
    }
}

/// Name the threads of rayon's global pool, the CPU backend's workers: `cpu-worker-N` in
/// `top -H`, gdb and `/proc/<pid>/task` (unnamed, they would carry the process's name, as
/// the ROS libraries' helper threads do). Their number is rayon's (`RAYON_NUM_THREADS`,
/// else one per CPU). The nodes call it first thing (the CLI does not: `bench-cpu --threads`
/// sizes the pool itself). Once the pool has started, it does nothing.
pub fn name_worker_threads() {
    let _ =
        rayon::ThreadPoolBuilder::new().thread_name(|i| format!("cpu-worker-{i}")).build_global();
}

/// Store f32 values as little-endian bytes of `dtype` into `out` (`src.len()` elements
/// of `dtype`; a shorter `out` stores fewer).
pub fn store(src: &[f32], dtype: DType, out: &mut [u8]) {
    let (es, store) = (dtype.size(), Store::of(dtype));
    const CHUNK: usize = 1 << 14;
    out.par_chunks_mut(CHUNK * es)
        .zip(src.par_chunks(CHUNK))
        .for_each_init(Vec::new, |half_buf, (dst, vals)| emit(vals, dst, store, half_buf));
}

fn fused(
    image: &ImageView<'_>,
    op: &PreprocessOp,
    out: &mut [u8],
    store: Store,
    simd: Simd,
    bands: &mut Vec<Scratch>,
) {
    with_source!(*image, s => {
        if op.params.channels == 1 {
            run::<_, 1>(&s, op, out, store, simd, bands)
        } else {
            run::<_, 3>(&s, op, out, store, simd, bands)
        }
    });
}

/// Which build of the inner loops runs (same values; see [`CpuBackend::set_simd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Simd {
    /// The portable loops, compiled for the target's baseline (SSE2 on x86-64; on
    /// aarch64 the compiler may use NEON where it vectorizes them by itself).
    #[default]
    Baseline,
    /// AVX2 (x86-64 only, when the CPU has it): the same loops compiled for AVX2.
    Avx2,
    /// NEON (aarch64 only, when the CPU has it): the inner loops written with NEON
    /// intrinsics (`backend/cpu/neon.rs`).
    Neon,
}

impl Simd {
    /// The best build this CPU runs.
    pub fn detect() -> Simd {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            return Simd::Avx2;
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Simd::Neon;
        }
        Simd::Baseline
    }
}

/// How output values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    /// f32, little-endian (the tensor's bytes).
    F32Le,
    /// f16 rounded to nearest even, little-endian.
    F16Le,
    /// f32 in native byte order (the f32 scratch tensor).
    F32Native,
}

impl Store {
    /// The little-endian tensor bytes of `dtype`.
    fn of(dtype: DType) -> Store {
        match dtype {
            DType::Float32 => Store::F32Le,
            DType::Float16 => Store::F16Le,
        }
    }

    fn size(self) -> usize {
        match self {
            Store::F32Le | Store::F32Native => 4,
            Store::F16Le => 2,
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    /// The slots in parallel (rayon), each exactly as [`Backend::process_into`] computes
    /// it. Times: `decode_us` and `conv_us` are the largest slot's decode and conv2d
    /// times, `preprocess_us` the rest of the batch's wall time.
    fn process_batch_into(&mut self, w: BatchWork<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
        let BatchWork { slots, conv } = w;
        let start = Instant::now();
        let item_len = crate::backend::check_batch(slots, out)?;
        if self.slots.len() < slots.len() {
            self.slots.resize_with(slots.len(), CpuBackend::new);
        }
        let times: Vec<Result<StageTimes>> = self
            .slots
            .par_iter_mut()
            .zip(slots.par_iter())
            .zip(out.par_chunks_mut(item_len))
            .enumerate()
            .map(|(i, ((backend, slot), chunk))| match slot.image {
                Some(image) => {
                    // The slot's stages nest in its own range, on the thread that runs it.
                    let _item = nvtx::push_with(|| nvtx::item_name(i));
                    backend.process_into(FrameWork::new(image, slot.op, conv), chunk)
                }
                None => {
                    crate::backend::fill_pad(&slot.op.params, chunk);
                    Ok(StageTimes::default())
                }
            })
            .collect();
        let (mut conv_us, mut decode_us) = (0.0f32, 0.0f32);
        for t in times {
            let t = t?;
            conv_us = conv_us.max(t.conv_us);
            decode_us = decode_us.max(t.decode_us);
        }
        let wall = start.elapsed().as_secs_f32() * 1e6;
        Ok(StageTimes {
            decode_us,
            preprocess_us: (wall - conv_us - decode_us).max(0.0),
            conv_us,
            ..StageTimes::default()
        })
    }

    fn device_description(&self) -> String {
        format!("CPU, {} threads, {:?}", rayon::current_num_threads(), self.simd)
    }

    fn diagnostics(&self) -> Vec<(String, String)> {
        let decoders = crate::backend::HOST_DECODERS;
        vec![(crate::backend::DECODER_KEY.to_string(), format!("on the CPU ({decoders})"))]
    }

    fn process_into(&mut self, work: FrameWork<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
        let FrameWork { image, op, conv } = work;
        crate::backend::check_out_len(op, out.len())?;
        op.check(image)?;
        // A compressed frame is decoded here, on the host (the spec's decoder).
        let decode_start = Instant::now();
        let pixels = HostPixels::of(image)?;
        let decode_us = match image {
            Input::Compressed(_) => decode_start.elapsed().as_secs_f32() * 1e6,
            Input::Pixels(_) | Input::Device(_) => 0.0,
        };
        let image = &pixels.view();
        let start = Instant::now();
        let Some(conv) = conv else {
            // No conv2d: one fused pass straight into the output dtype.
            let _range = nvtx::stage(Stage::Preprocess);
            self.preprocess_into(image, op, out)?;
            return Ok(StageTimes {
                decode_us,
                preprocess_us: start.elapsed().as_secs_f32() * 1e6,
                ..StageTimes::default()
            });
        };
        // conv2d runs on the normalized f32 tensor: fused pass into f32, conv2d, then the
        // dtype conversion.
        nvtx::stage(Stage::Preprocess).scope(|| self.preprocess_f32(image, op))?;
        let preprocess_us = start.elapsed().as_secs_f32() * 1e6;
        let desc = op.params.tensor_desc();
        let conv_us = nvtx::stage(Stage::Conv)
            .scope(|| conv::apply(&desc, Some(conv), &mut self.scratch, &mut self.conv_scratch))?;
        store(&self.scratch, desc.dtype, out);
        Ok(StageTimes { decode_us, preprocess_us, conv_us, ..StageTimes::default() })
    }
}

/// Per-band scratch: two horizontally blended source rows (planar, `C` planes of
/// `content_w`), one decoded source row, and one output row before conversion.
#[derive(Debug, Default)]
struct Scratch {
    /// Horizontal blends of two source rows; `keys` says which rows.
    hrows: [Vec<f32>; 2],
    keys: [Option<usize>; 2],
    /// A source row decoded once, planar (when it has fewer pixels than taps), and the
    /// two taps of each output column gathered from it (`C` planes of `content_w`).
    decoded: Vec<f32>,
    tap0: Vec<f32>,
    tap1: Vec<f32>,
    /// The output row in f32, in the output layout (NCHW: `C` planes of `width`).
    row: Vec<f32>,
    /// The output row in f16.
    half: Vec<half::f16>,
}

/// What every band needs, resolved once per frame.
struct Frame<'a> {
    p: &'a PreprocessParams,
    x_map: &'a AxisMap,
    y_map: &'a AxisMap,
    /// Every x weight is 0: read only `i0`.
    x_single: bool,
    /// Decode each source pixel of the region once per row, then gather the taps (when
    /// the region has at most half as many pixels as a row has taps: upscaling);
    /// otherwise decode the taps themselves.
    x_predecode: bool,
    /// First source column of the region and its width.
    x_start: usize,
    x_len: usize,
    /// `x_map.i0`, `x_map.i1` relative to `x_start` (predecode path).
    rel_i0: Vec<u32>,
    rel_i1: Vec<u32>,
    /// Output channel c reads plane `src_plane[c]` of the blended rows (RGB or grey).
    src_plane: [usize; 3],
    layout: Layout,
    store: Store,
    /// The build of the band loop to run (AVX2 and NEON only where detected).
    simd: Simd,
}

impl<'a> Frame<'a> {
    /// What the bands of `op` need (`swap`: red and blue swapped).
    fn of(op: &'a PreprocessOp, swap: bool, store: Store, simd: Simd) -> Self {
        let p = &op.params;
        let x_single = op.x_map.w1.iter().all(|&v| v == 0.0);
        let taps = op.x_map.i0.len() * if x_single { 1 } else { 2 };
        let x_start = op.x_map.i0.iter().chain(&op.x_map.i1).copied().min().unwrap_or(0) as usize;
        let x_end = op.x_map.i0.iter().chain(&op.x_map.i1).copied().max().unwrap_or(0) as usize + 1;
        let x_predecode = 2 * (x_end - x_start) <= taps;
        let rel = |m: &[i32]| -> Vec<u32> {
            if x_predecode {
                m.iter().map(|&i| (i as usize - x_start) as u32).collect()
            } else {
                Vec::new()
            }
        };
        Frame {
            p,
            x_map: &op.x_map,
            y_map: &op.y_map,
            x_single,
            x_predecode,
            x_start,
            x_len: x_end - x_start,
            rel_i0: rel(&op.x_map.i0),
            rel_i1: rel(&op.x_map.i1),
            src_plane: if swap { [2, 1, 0] } else { [0, 1, 2] },
            layout: p.tensor_desc().layout,
            store,
            simd,
        }
    }
}

fn run<S: Source, const C: usize>(
    src: &S,
    op: &PreprocessOp,
    out: &mut [u8],
    store: Store,
    simd: Simd,
    bands: &mut Vec<Scratch>,
) {
    let p = &op.params;
    let (w, h) = (p.dst_width as usize, p.dst_height as usize);
    let desc = p.tensor_desc();
    let es = store.size();
    let frame = Frame::of(op, C == 3 && p.swap_rb != 0, store, simd);
    // Bands of whole rows: several per thread so a busy core does not hold the frame up.
    let n_bands = (rayon::current_num_threads() * 4).clamp(1, h);
    let band_rows = h.div_ceil(n_bands);
    let n_bands = h.div_ceil(band_rows);
    if bands.len() < n_bands {
        bands.resize_with(n_bands, Scratch::default);
    }
    match desc.layout {
        Layout::Nhwc => {
            out.par_chunks_mut(band_rows * w * C * es)
                .zip(bands.par_iter_mut())
                .enumerate()
                .for_each(|(b, (chunk, scratch))| {
                    let rows = b * band_rows..((b + 1) * band_rows).min(h);
                    band_dispatch::<S, C>(src, &frame, rows, [chunk, &mut [], &mut []], scratch);
                });
        }
        Layout::Nchw => {
            // Split each channel plane into the bands' row ranges.
            let mut outs: Vec<[&mut [u8]; 3]> =
                (0..n_bands).map(|_| [&mut [][..], &mut [][..], &mut [][..]]).collect();
            for (c, plane) in out.chunks_mut(h * w * es).enumerate() {
                for (b, chunk) in plane.chunks_mut(band_rows * w * es).enumerate() {
                    outs[b][c] = chunk;
                }
            }
            outs.into_par_iter().zip(bands.par_iter_mut()).enumerate().for_each(
                |(b, (planes, scratch))| {
                    let rows = b * band_rows..((b + 1) * band_rows).min(h);
                    band_dispatch::<S, C>(src, &frame, rows, planes, scratch);
                },
            );
        }
    }
}

/// [`band`] in the build the frame chose: compiled for AVX2 (x86-64; the baseline is
/// SSE2), with the NEON inner loops (aarch64), or the portable loops. The values are the
/// same: IEEE f32 operations in the same order, no fused multiply-add, integer
/// arithmetic exact.
fn band_dispatch<S: Source, const C: usize>(
    src: &S,
    f: &Frame<'_>,
    rows: std::ops::Range<usize>,
    outs: [&mut [u8]; 3],
    sc: &mut Scratch,
) {
    match f.simd {
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => {
            // SAFETY: `f.simd` is `Avx2` only when `is_x86_feature_detected!("avx2")` is
            // true (`Simd::detect`, `CpuBackend::set_simd`), so every instruction of
            // `band_avx2` exists on this CPU.
            unsafe { band_avx2::<S, C>(src, f, rows, outs, sc) };
        }
        #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
        Simd::Neon => band::<S, C, neon::Neon>(src, f, rows, outs, sc),
        _ => band::<S, C, Portable>(src, f, rows, outs, sc),
    }
}

/// [`band`] compiled with AVX2 enabled.
///
/// # Safety
/// The CPU must support AVX2 (callers check `Simd::detect`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn band_avx2<S: Source, const C: usize>(
    src: &S,
    f: &Frame<'_>,
    rows: std::ops::Range<usize>,
    outs: [&mut [u8]; 3],
    sc: &mut Scratch,
) {
    band::<S, C, Portable>(src, f, rows, outs, sc);
}

/// The inner loops of [`band`] that have a hand-written NEON build (`neon.rs`). The
/// portable ones ([`Portable`]) are the definition; another build computes the same IEEE
/// f32 operations in the same order (and exact integers), so the same bits.
trait Loops {
    /// `out[i] = a[i] * (1 - w[i]) + b[i] * w[i]` (the horizontal blend).
    fn hblend(out: &mut [f32], a: &[f32], b: &[f32], w: &[f32]);
    /// The vertical blend and the normalization of one output row's content: output
    /// channel c of columns `cx..cx + cw` of `row` (`C` planes of `w`, or `w` pixels of `C`
    /// values in NHWC) is `(t[i] * (1 - wy) + u[i] * wy) * scale[c] + bias[c]` (or
    /// `t[i] * scale[c] + bias[c]` without `two`), `t`, `u` plane `src_plane[c]` of the
    /// two horizontally blended rows `h`.
    #[allow(clippy::too_many_arguments)]
    fn vblend_row<const C: usize>(
        row: &mut [f32],
        h: (&[f32], &[f32]),
        src_plane: [usize; 3],
        wy: (bool, f32),
        cols: (usize, usize, usize),
        nhwc: bool,
        p: &PreprocessParams,
    );
    /// Convert an f32 row as `store` says, into `dst`.
    fn emit(vals: &[f32], dst: &mut [u8], store: Store, half_buf: &mut Vec<half::f16>);
    /// The taps `xs` of a source row, as [`Source::decode_at`].
    fn decode_at<S: Source, const C: usize>(row: S::Row<'_>, xs: &[i32], out: &mut [f32]);
}

/// The portable inner loops (the compiler vectorizes them for the target's baseline, or
/// for AVX2 inside `band_avx2`).
struct Portable;

impl Loops for Portable {
    #[inline(always)]
    fn hblend(out: &mut [f32], a: &[f32], b: &[f32], w: &[f32]) {
        for (((d, &a), &b), &w) in out.iter_mut().zip(a).zip(b).zip(w) {
            *d = a * (1.0 - w) + b * w;
        }
    }

    #[inline(always)]
    fn vblend_row<const C: usize>(
        row: &mut [f32],
        (h0, h1): (&[f32], &[f32]),
        src_plane: [usize; 3],
        (two, wy): (bool, f32),
        (cx, cw, w): (usize, usize, usize),
        nhwc: bool,
        p: &PreprocessParams,
    ) {
        for c in 0..C {
            let sp = src_plane[c];
            let t = &h0[sp * cw..(sp + 1) * cw];
            let u = &h1[sp * cw..(sp + 1) * cw];
            let (scale, bias) = (p.scale[c], p.bias[c]);
            if nhwc {
                let dst = &mut row[cx * C..(cx + cw) * C];
                vblend(dst.iter_mut().skip(c).step_by(C), t, u, two, wy, scale, bias);
            } else {
                let dst = &mut row[c * w + cx..c * w + cx + cw];
                vblend(dst.iter_mut(), t, u, two, wy, scale, bias);
            }
        }
    }

    #[inline(always)]
    fn emit(vals: &[f32], dst: &mut [u8], store: Store, half_buf: &mut Vec<half::f16>) {
        emit(vals, dst, store, half_buf);
    }

    #[inline(always)]
    fn decode_at<S: Source, const C: usize>(row: S::Row<'_>, xs: &[i32], out: &mut [f32]) {
        S::decode_at::<C>(row, xs, out);
    }
}

/// Output rows `rows` into `outs` (NHWC: `outs[0]` holds the band's rows; NCHW:
/// `outs[c]` holds the band's rows of plane c).
#[inline(always)]
fn band<S: Source, const C: usize, L: Loops>(
    src: &S,
    f: &Frame<'_>,
    rows: std::ops::Range<usize>,
    mut outs: [&mut [u8]; 3],
    sc: &mut Scratch,
) {
    let p = f.p;
    let w = p.dst_width as usize;
    let (cx, cw) = (p.content_x as usize, p.content_w as usize);
    let (cy, ch) = (p.content_y as usize, p.content_h as usize);
    for hr in &mut sc.hrows {
        hr.resize(C * cw, 0.0);
    }
    sc.keys = [None, None];
    if f.x_predecode {
        sc.decoded.resize(C * f.x_len, 0.0);
    }
    sc.tap0.resize(C * cw, 0.0);
    sc.tap1.resize(C * cw, 0.0);
    sc.row.resize(C * w, 0.0);
    let es = f.store.size();
    let nhwc = f.layout == Layout::Nhwc;
    for (i, y) in rows.enumerate() {
        if y < cy || y >= cy + ch {
            fill_pad::<C>(&mut sc.row, &p.pad, 0..w, w, nhwc);
        } else {
            let dy = y - cy;
            let (y0, y1, wy) = (f.y_map.i0[dy] as usize, f.y_map.i1[dy] as usize, f.y_map.w1[dy]);
            let two = wy != 0.0;
            let s0 = ensure_row::<S, C, L>(src, f, sc, y0, two.then_some(y1));
            let s1 = if two { ensure_row::<S, C, L>(src, f, sc, y1, Some(y0)) } else { s0 };
            fill_pad::<C>(&mut sc.row, &p.pad, 0..cx, w, nhwc);
            fill_pad::<C>(&mut sc.row, &p.pad, cx + cw..w, w, nhwc);
            let (h0, h1) = (&sc.hrows[s0], &sc.hrows[s1]);
            let dst = &mut sc.row[..];
            L::vblend_row::<C>(dst, (h0, h1), f.src_plane, (two, wy), (cx, cw, w), nhwc, p);
        }
        // Store the row (f32 or f16, little-endian) into the output.
        if nhwc {
            let n = w * C;
            let dst = &mut outs[0][i * n * es..(i + 1) * n * es];
            L::emit(&sc.row[..n], dst, f.store, &mut sc.half);
        } else {
            for (c, plane) in outs.iter_mut().enumerate().take(C) {
                let dst = &mut plane[i * w * es..(i + 1) * w * es];
                L::emit(&sc.row[c * w..(c + 1) * w], dst, f.store, &mut sc.half);
            }
        }
    }
}

/// `dst = (t * (1 - wy) + u * wy) * scale + bias` (or `t * scale + bias` when the second
/// row has weight 0, which is the same value).
#[inline(always)]
fn vblend<'a>(
    dst: impl Iterator<Item = &'a mut f32>,
    t: &[f32],
    u: &[f32],
    two: bool,
    wy: f32,
    scale: f32,
    bias: f32,
) {
    if two {
        let iw = 1.0 - wy;
        for ((d, &a), &b) in dst.zip(t).zip(u) {
            *d = (a * iw + b * wy) * scale + bias;
        }
    } else {
        for (d, &a) in dst.zip(t) {
            *d = a * scale + bias;
        }
    }
}

/// Pad columns `cols` of the output row with each channel's padding value.
#[inline(always)]
fn fill_pad<const C: usize>(
    row: &mut [f32],
    pad: &[f32; 3],
    cols: std::ops::Range<usize>,
    w: usize,
    nhwc: bool,
) {
    if cols.is_empty() {
        return;
    }
    if nhwc {
        for px in row[cols.start * C..cols.end * C].chunks_exact_mut(C) {
            px.copy_from_slice(&pad[..C]);
        }
    } else {
        for (c, &v) in pad.iter().enumerate().take(C) {
            row[c * w + cols.start..c * w + cols.end].fill(v);
        }
    }
}

/// Convert an f32 row as `store` says, into `dst`.
#[inline(always)]
fn emit(vals: &[f32], dst: &mut [u8], store: Store, half_buf: &mut Vec<half::f16>) {
    match store {
        Store::F32Le => {
            for (o, v) in dst.chunks_exact_mut(4).zip(vals) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        Store::F32Native => {
            for (o, v) in dst.chunks_exact_mut(4).zip(vals) {
                o.copy_from_slice(&v.to_ne_bytes());
            }
        }
        Store::F16Le => {
            half_buf.resize(vals.len(), half::f16::ZERO);
            half_buf.convert_from_f32_slice(vals);
            for (o, v) in dst.chunks_exact_mut(2).zip(half_buf.iter()) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// Make sure the horizontal blend of source row `y` is in one of the two slots (without
/// evicting `keep`), and return the slot.
#[inline(always)]
fn ensure_row<S: Source, const C: usize, L: Loops>(
    src: &S,
    f: &Frame<'_>,
    sc: &mut Scratch,
    y: usize,
    keep: Option<usize>,
) -> usize {
    if let Some(slot) = sc.keys.iter().position(|k| *k == Some(y)) {
        return slot;
    }
    let slot = if keep.is_some() && sc.keys[0] == keep { 1 } else { 0 };
    let taps = (&mut sc.tap0[..], &mut sc.tap1[..]);
    hpass::<S, C, L>(src, f, y, &mut sc.hrows[slot], &mut sc.decoded, taps);
    sc.keys[slot] = Some(y);
    slot
}

/// Horizontal pass of source row `y` into `out` (`C` planes of `content_w`):
/// `out[k][dx] = s(i0[dx])[k] * (1 - w1[dx]) + s(i1[dx])[k] * w1[dx]`.
#[inline(always)]
fn hpass<S: Source, const C: usize, L: Loops>(
    src: &S,
    f: &Frame<'_>,
    y: usize,
    out: &mut [f32],
    decoded: &mut [f32],
    (tap0, tap1): (&mut [f32], &mut [f32]),
) {
    let row = src.row(y);
    let m = f.x_map;
    let cw = m.i0.len();
    if f.x_single {
        // Weight 0 on every second tap: the value is the first tap.
        if f.x_predecode {
            S::decode_row::<C>(row, f.x_start, f.x_len, decoded);
            gather::<C>(decoded, f.x_len, &f.rel_i0[..cw], out);
        } else {
            L::decode_at::<S, C>(row, &m.i0, out);
        }
        return;
    }
    if f.x_predecode {
        // Fewer source pixels than taps (upscaling): decode each pixel of the region
        // once, then gather the taps from the decoded row.
        S::decode_row::<C>(row, f.x_start, f.x_len, decoded);
        gather::<C>(decoded, f.x_len, &f.rel_i0[..cw], tap0);
        gather::<C>(decoded, f.x_len, &f.rel_i1[..cw], tap1);
    } else {
        L::decode_at::<S, C>(row, &m.i0, tap0);
        L::decode_at::<S, C>(row, &m.i1, tap1);
    }
    // The blend, in a straight loop that vectorizes.
    let w1 = &m.w1[..cw];
    for k in 0..C {
        let (t0, t1) = (&tap0[k * cw..(k + 1) * cw], &tap1[k * cw..(k + 1) * cw]);
        L::hblend(&mut out[k * cw..(k + 1) * cw], t0, t1, w1);
    }
}

/// `out[k][i] = decoded[k][idx[i]]` for the `C` planes of `n` values of `decoded`.
#[inline(always)]
fn gather<const C: usize>(decoded: &[f32], n: usize, idx: &[u32], out: &mut [f32]) {
    let len = idx.len();
    // Every relative index is < n by construction; `min(n - 1)` tells the compiler so
    // (no bounds check in the loop).
    let last = n as u32 - 1;
    for k in 0..C {
        let p = &decoded[k * n..(k + 1) * n];
        for (d, &i) in out[k * len..(k + 1) * len].iter_mut().zip(idx) {
            *d = p[i.min(last) as usize];
        }
    }
}
