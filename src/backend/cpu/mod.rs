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
//! - one `match` on the encoding per frame ([`decode::with_source`]): the loops are
//!   monomorphised per encoding and channel count; the vertical blend, normalization and
//!   store are plain slice loops the compiler vectorizes;
//! - taps of weight 0 (nearest; integer downscale factors such as 1920 -> 640) are not
//!   read: `a * (1 - 0) + b * 0 == a` exactly, so this changes no value;
//! - no intermediate full-size image: every sample is decoded from the source bytes.

mod conv;
pub mod decode;
pub mod reference;

pub use conv::{border_index, conv2d, ConvScratch};

use crate::backend::{AxisMap, Backend, Conv2dOp, PreprocessOp, PreprocessParams, StageTimes};
use crate::config::{DType, Layout};
use crate::error::{Error, Result};
use crate::image::ImageView;
use decode::{with_source, Source};
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use std::time::Instant;

/// The CPU backend (rayon's global thread pool).
#[derive(Debug, Default)]
pub struct CpuBackend {
    bands: Vec<Scratch>,
    /// The normalized f32 tensor, when conv2d runs on it before the dtype conversion.
    scratch: Vec<f32>,
    conv_scratch: conv::ConvScratch,
}

impl CpuBackend {
    /// A CPU backend using rayon's global pool.
    pub fn new() -> Self {
        CpuBackend::default()
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
        check_op(image, op)?;
        let desc = op.params.tensor_desc();
        out.resize(desc.byte_len(), 0);
        let store = match desc.dtype {
            DType::Float32 => Store::F32Le,
            DType::Float16 => Store::F16Le,
        };
        fused(image, op, out, store, &mut self.bands);
        Ok(())
    }

    /// The same pass into [`CpuBackend::f32_tensor`]: the normalized tensor as native
    /// f32 in the output layout, before any dtype conversion (for conv2d).
    pub fn preprocess_f32(&mut self, image: &ImageView<'_>, op: &PreprocessOp) -> Result<()> {
        check_op(image, op)?;
        self.scratch.resize(op.params.tensor_desc().len(), 0.0);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.scratch[..]);
        fused(image, op, bytes, Store::F32Native, &mut self.bands);
        Ok(())
    }

    /// The tensor written by [`CpuBackend::preprocess_f32`].
    pub fn f32_tensor(&mut self) -> &mut [f32] {
        &mut self.scratch
    }
}

/// Store f32 values as little-endian bytes of `dtype` into `out` (resized to fit).
pub fn store(src: &[f32], dtype: DType, out: &mut Vec<u8>) {
    let es = dtype.size();
    out.resize(src.len() * es, 0);
    let store = match dtype {
        DType::Float32 => Store::F32Le,
        DType::Float16 => Store::F16Le,
    };
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
    bands: &mut Vec<Scratch>,
) {
    with_source!(*image, s => {
        if op.params.channels == 1 {
            run::<_, 1>(&s, op, out, store, bands)
        } else {
            run::<_, 3>(&s, op, out, store, bands)
        }
    });
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

    fn device_description(&self) -> String {
        format!("CPU, {} threads", rayon::current_num_threads())
    }

    fn process(
        &mut self,
        image: &ImageView<'_>,
        op: &PreprocessOp,
        conv: Option<&Conv2dOp>,
        out: &mut Vec<u8>,
    ) -> Result<StageTimes> {
        let start = Instant::now();
        let Some(conv) = conv else {
            // No conv2d: one fused pass straight into the output dtype.
            self.preprocess(image, op, out)?;
            return Ok(StageTimes {
                preprocess_us: start.elapsed().as_secs_f32() * 1e6,
                ..StageTimes::default()
            });
        };
        // conv2d runs on the normalized f32 tensor: fused pass into f32, conv2d, then the
        // dtype conversion.
        self.preprocess_f32(image, op)?;
        let preprocess_us = start.elapsed().as_secs_f32() * 1e6;
        let desc = op.params.tensor_desc();
        let conv_us = conv::apply(&desc, Some(conv), &mut self.scratch, &mut self.conv_scratch)?;
        store(&self.scratch, desc.dtype, out);
        Ok(StageTimes { preprocess_us, conv_us, ..StageTimes::default() })
    }
}

/// Check that `op` was built for `image` (sizes, table lengths, every table index inside
/// the image, the content rectangle inside the network image), so that the passes never
/// index out of bounds. [`crate::pipeline::preprocess_op`] always builds a consistent
/// operation; this guards hand-made ones.
pub fn check_op(image: &ImageView<'_>, op: &PreprocessOp) -> Result<()> {
    let p = &op.params;
    let bad = |what: String| Err(Error::Operation(what));
    if p.src_width != image.width() || p.src_height != image.height() {
        return bad(format!(
            "built for a {}x{} source, image is {}x{}",
            p.src_width,
            p.src_height,
            image.width(),
            image.height()
        ));
    }
    if p.channels != 1 && p.channels != 3 {
        return bad(format!("channels {} (1 or 3)", p.channels));
    }
    if p.dst_width == 0 || p.dst_height == 0 {
        return bad(format!("network size {}x{}", p.dst_width, p.dst_height));
    }
    let fits = |o: u32, l: u32, n: u32| u64::from(o) + u64::from(l) <= u64::from(n);
    if p.content_w == 0
        || p.content_h == 0
        || !fits(p.content_x, p.content_w, p.dst_width)
        || !fits(p.content_y, p.content_h, p.dst_height)
    {
        return bad(format!(
            "content [{}, {}, {}, {}] not inside the {}x{} network image",
            p.content_x, p.content_y, p.content_w, p.content_h, p.dst_width, p.dst_height
        ));
    }
    check_map("x", &op.x_map, p.content_w, image.width())?;
    check_map("y", &op.y_map, p.content_h, image.height())
}

fn check_map(axis: &str, m: &AxisMap, len: u32, src: u32) -> Result<()> {
    let n = len as usize;
    if m.i0.len() != n || m.i1.len() != n || m.w1.len() != n {
        return Err(Error::Operation(format!(
            "{axis} table lengths {}/{}/{} (i0/i1/w1), expected {n}",
            m.i0.len(),
            m.i1.len(),
            m.w1.len()
        )));
    }
    let inside = |i: &i32| *i >= 0 && (*i as u32) < src;
    if !m.i0.iter().all(inside) || !m.i1.iter().all(inside) {
        return Err(Error::Operation(format!("{axis} table indexes outside 0..{src}")));
    }
    if !m.w1.iter().all(|w| w.is_finite()) {
        return Err(Error::Operation(format!("{axis} table has non-finite weights")));
    }
    Ok(())
}

/// Per-band scratch: two horizontally blended source rows (planar, `C` planes of
/// `content_w`), one decoded source row, and one output row before conversion.
#[derive(Debug, Default)]
struct Scratch {
    /// Horizontal blends of two source rows; `keys` says which rows.
    hrows: [Vec<f32>; 2],
    keys: [Option<usize>; 2],
    /// A source row decoded once, planar (upscaling: fewer decodes than taps).
    decoded: Vec<f32>,
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
    /// Decode each source pixel of the region once per row, then gather (when the
    /// region is narrower than the number of taps, i.e. upscaling).
    x_predecode: bool,
    /// First source column of the region and its width.
    x_start: usize,
    x_len: usize,
    /// Output channel c reads plane `src_plane[c]` of the blended rows (RGB or grey).
    src_plane: [usize; 3],
    layout: Layout,
    store: Store,
}

fn run<S: Source, const C: usize>(
    src: &S,
    op: &PreprocessOp,
    out: &mut [u8],
    store: Store,
    bands: &mut Vec<Scratch>,
) {
    let p = &op.params;
    let (w, h) = (p.dst_width as usize, p.dst_height as usize);
    let desc = p.tensor_desc();
    let es = store.size();
    let x_single = op.x_map.w1.iter().all(|&v| v == 0.0);
    let taps = op.x_map.i0.len() * if x_single { 1 } else { 2 };
    let x_start = op.x_map.i0.iter().chain(&op.x_map.i1).copied().min().unwrap_or(0) as usize;
    let x_end = op.x_map.i0.iter().chain(&op.x_map.i1).copied().max().unwrap_or(0) as usize + 1;
    let swap = C == 3 && p.swap_rb != 0;
    let frame = Frame {
        p,
        x_map: &op.x_map,
        y_map: &op.y_map,
        x_single,
        x_predecode: x_end - x_start <= taps,
        x_start,
        x_len: x_end - x_start,
        src_plane: if swap { [2, 1, 0] } else { [0, 1, 2] },
        layout: desc.layout,
        store,
    };
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
                    band::<S, C>(src, &frame, rows, [chunk, &mut [], &mut []], scratch);
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
                    band::<S, C>(src, &frame, rows, planes, scratch);
                },
            );
        }
    }
}

/// Output rows `rows` into `outs` (NHWC: `outs[0]` holds the band's rows; NCHW:
/// `outs[c]` holds the band's rows of plane c).
fn band<S: Source, const C: usize>(
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
            let s0 = ensure_row::<S, C>(src, f, sc, y0, two.then_some(y1));
            let s1 = if two { ensure_row::<S, C>(src, f, sc, y1, Some(y0)) } else { s0 };
            fill_pad::<C>(&mut sc.row, &p.pad, 0..cx, w, nhwc);
            fill_pad::<C>(&mut sc.row, &p.pad, cx + cw..w, w, nhwc);
            let (h0, h1) = (&sc.hrows[s0], &sc.hrows[s1]);
            for c in 0..C {
                let sp = f.src_plane[c];
                let t = &h0[sp * cw..(sp + 1) * cw];
                let u = &h1[sp * cw..(sp + 1) * cw];
                let (scale, bias) = (p.scale[c], p.bias[c]);
                if nhwc {
                    let dst = &mut sc.row[cx * C..(cx + cw) * C];
                    vblend(dst.iter_mut().skip(c).step_by(C), t, u, two, wy, scale, bias);
                } else {
                    let dst = &mut sc.row[c * w + cx..c * w + cx + cw];
                    vblend(dst.iter_mut(), t, u, two, wy, scale, bias);
                }
            }
        }
        // Store the row (f32 or f16, little-endian) into the output.
        if nhwc {
            let n = w * C;
            let dst = &mut outs[0][i * n * es..(i + 1) * n * es];
            emit(&sc.row[..n], dst, f.store, &mut sc.half);
        } else {
            for (c, plane) in outs.iter_mut().enumerate().take(C) {
                let dst = &mut plane[i * w * es..(i + 1) * w * es];
                emit(&sc.row[c * w..(c + 1) * w], dst, f.store, &mut sc.half);
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
fn ensure_row<S: Source, const C: usize>(
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
    hpass::<S, C>(src, f, y, &mut sc.hrows[slot], &mut sc.decoded);
    sc.keys[slot] = Some(y);
    slot
}

/// Horizontal pass of source row `y` into `out` (`C` planes of `content_w`):
/// `out[k][dx] = s(i0[dx])[k] * (1 - w1[dx]) + s(i1[dx])[k] * w1[dx]`.
fn hpass<S: Source, const C: usize>(
    src: &S,
    f: &Frame<'_>,
    y: usize,
    out: &mut [f32],
    decoded: &mut [f32],
) {
    let row = src.row(y);
    let m = f.x_map;
    let cw = m.i0.len();
    let sample = |x: usize| -> [f32; C] { decode::pixel::<S, C>(row, x) };
    if f.x_predecode {
        // Decode the region's pixels once, planar, then blend from the decoded row.
        let n = f.x_len;
        S::decode_row::<C>(row, f.x_start, n, decoded);
        for k in 0..C {
            let plane = &decoded[k * n..(k + 1) * n];
            let dst = &mut out[k * cw..(k + 1) * cw];
            let at = |i: i32| plane[i as usize - f.x_start];
            if f.x_single {
                for (d, &i) in dst.iter_mut().zip(&m.i0) {
                    *d = at(i);
                }
            } else {
                for (((d, &i0), &i1), &w) in dst.iter_mut().zip(&m.i0).zip(&m.i1).zip(&m.w1) {
                    *d = at(i0) * (1.0 - w) + at(i1) * w;
                }
            }
        }
        return;
    }
    if f.x_single {
        for (dx, &i) in m.i0.iter().enumerate() {
            let a = sample(i as usize);
            for k in 0..C {
                out[k * cw + dx] = a[k];
            }
        }
    } else {
        for (dx, ((&i0, &i1), &w)) in m.i0.iter().zip(&m.i1).zip(&m.w1).enumerate() {
            let (a, b) = (sample(i0 as usize), sample(i1 as usize));
            let iw = 1.0 - w;
            for k in 0..C {
                out[k * cw + dx] = a[k] * iw + b[k] * w;
            }
        }
    }
}
