//! conv2d on the CPU, the specification: each channel of the f32 network image
//! correlated with the kernel (= `cv2.filter2D`), borders as `cv::borderInterpolate`.
//!
//! The definition, per output element `(c, y, x)`, with `r = size / 2` and `B(p, len)`
//! = [`border_index`] (a tap whose `B` is `None` reads 0):
//!
//! - direct (`separable: None`): `acc = 0; for ky in 0..size { for kx in 0..size {
//!   acc += w[ky*size+kx] * in[c][B(y+ky-r, H)][B(x+kx-r, W)] } }`, in f32, in this
//!   order;
//! - separable `(kx, ky)`: `t[c][y'][x] = Σ_j kx[j] * in[c][y'][B(x+j-r, W)]` (j
//!   ascending, f32) for every row `y'`, then `out[c][y][x] = Σ_i ky[i] *
//!   t[c][B(y+i-r, H)][x]` (i ascending, f32).
//!
//! The row kernels below compute exactly these sums in exactly this order (the tests
//! check bit-identity with a per-element transcription), so the result does not depend
//! on the layout (NCHW or NHWC), the block size or the thread count.

use crate::backend::{Conv2dOp, TensorDesc};
use crate::config::{Border, Layout};
use crate::error::{Error, Result};
use rayon::prelude::*;

/// Elements of a row computed together in registers (a multiple of every SIMD width the
/// compiler may use, so each tap is one vector multiply-add per register).
const BLOCK: usize = 16;
/// Most taps of one 1-D factor (`Conv2dOp::MAX_SIZE`).
const MAX_TAPS: usize = Conv2dOp::MAX_SIZE as usize;

/// Buffers kept from frame to frame: one f32 copy of the image (the horizontal pass's
/// output, or the direct path's input) and the two border tables.
#[derive(Debug, Default)]
pub struct ConvScratch {
    tmp: Vec<f32>,
    /// `xmap[x + r]` = source column of column `x` in `-r..W+r`, or -1 (reads 0).
    xmap: Vec<i32>,
    /// `ymap[y + r]` = source row of row `y` in `-r..H+r`, or -1 (reads 0).
    ymap: Vec<i32>,
}

/// `cv::borderInterpolate(p, len, border)`: the index read for position `p` of an axis of
/// `len` pixels, or `None` where the constant border reads 0.
///
/// - replicate: `aaaa|abcdefgh|hhhh`, clamp to `0..len`;
/// - reflect101: `dcb|abcdefgh|gfe`, reflected about the edge pixels as many times as
///   needed (a kernel may be wider than the image): with period `2 * (len - 1)`,
///   `q = p mod period`, index `q < len ? q : period - q`. A 1-pixel axis reads index 0
///   (OpenCV's `if (len == 1) return 0`: reflect101 then equals replicate);
/// - constant: `None` (0 in normalized units) outside `0..len`.
pub fn border_index(p: i64, len: usize, border: Border) -> Option<usize> {
    let n = len as i64;
    if (0..n).contains(&p) {
        return Some(p as usize);
    }
    if n == 0 {
        return None;
    }
    match border {
        Border::Constant => None,
        Border::Replicate => Some(if p < 0 { 0 } else { len - 1 }),
        Border::Reflect101 if n == 1 => Some(0),
        Border::Reflect101 => {
            let period = 2 * (n - 1);
            let q = p.rem_euclid(period);
            Some(if q < n { q } else { period - q } as usize)
        }
    }
}

/// The table `map[i] = border_index(i - r, len)` for `i` in `0..len + 2r` (-1: reads 0).
fn fill_map(map: &mut Vec<i32>, len: usize, r: usize, border: Border) {
    map.clear();
    map.extend(
        (0..len + 2 * r)
            .map(|i| border_index(i as i64 - r as i64, len, border).map_or(-1, |v| v as i32)),
    );
}

/// Apply `op` in place to `data`, the f32 tensor `desc` (NCHW or NHWC; every channel is
/// filtered on its own). `scratch` is reused across frames (no allocation once it has
/// grown to the largest frame).
pub fn conv2d(
    desc: &TensorDesc,
    op: &Conv2dOp,
    data: &mut [f32],
    scratch: &mut ConvScratch,
) -> Result<()> {
    op.check()?;
    if data.len() != desc.len() {
        return Err(Error::config(
            "conv",
            format!("a buffer of {} values", data.len()),
            format!(
                "the tensor {:?} has {} values (internal error: please report)",
                desc.shape(),
                desc.len()
            ),
        ));
    }
    if data.is_empty() {
        return Ok(());
    }
    let (h, w, c) = (desc.height as usize, desc.width as usize, desc.channels as usize);
    // Rows of `row_len` elements; horizontal neighbours are `stride` elements apart. NHWC
    // interleaves the channels: one "plane" whose taps step over whole pixels.
    let (planes, stride) = match desc.layout {
        Layout::Nchw => (c, 1),
        Layout::Nhwc => (1, c),
    };
    let row_len = w * stride;
    let plane_len = h * row_len;
    let r = op.radius();
    let size = op.size as usize;
    let ConvScratch { tmp, xmap, ymap } = scratch;
    fill_map(xmap, w, r, op.border);
    fill_map(ymap, h, r, op.border);
    tmp.resize(data.len(), 0.0);
    let cols = Columns { width: w, stride, radius: r, xmap };
    debug_assert_eq!(planes * plane_len, data.len());
    match &op.separable {
        Some((kx, ky)) => {
            tmp.par_chunks_mut(row_len)
                .zip(data.par_chunks(row_len))
                .for_each(|(dst, src)| cols.correlate_row(dst, src, kx, false));
            let tmp = &tmp[..];
            data.par_chunks_mut(row_len).enumerate().for_each(|(g, dst)| {
                let (plane, y) = (g / h, g % h);
                let src = &tmp[plane * plane_len..(plane + 1) * plane_len];
                vertical_row(dst, src, row_len, ky, &ymap[y..y + size]);
            });
        }
        None => {
            tmp.copy_from_slice(data);
            let tmp = &tmp[..];
            data.par_chunks_mut(row_len).enumerate().for_each(|(g, dst)| {
                let (plane, y) = (g / h, g % h);
                let src = &tmp[plane * plane_len..(plane + 1) * plane_len];
                dst.fill(0.0);
                for (ky, &m) in ymap[y..y + size].iter().enumerate() {
                    if m >= 0 {
                        let row = &src[m as usize * row_len..(m as usize + 1) * row_len];
                        cols.correlate_row(dst, row, &op.weights[ky * size..(ky + 1) * size], true);
                    }
                }
            });
        }
    }
    Ok(())
}

/// The horizontal geometry of a row.
struct Columns<'a> {
    width: usize,
    stride: usize,
    radius: usize,
    xmap: &'a [i32],
}

impl Columns<'_> {
    /// `dst[x] (+)= Σ_j taps[j] * src[B(x + j - r)]` for every pixel `x` of the row (each of
    /// its `stride` channels): the interior (all taps inside) in vector blocks, the
    /// `r` pixels at each end through the border table.
    fn correlate_row(&self, dst: &mut [f32], src: &[f32], taps: &[f32], accumulate: bool) {
        let (w, s, r) = (self.width, self.stride, self.radius);
        // Interior pixels [x0, x1): every tap lands inside the row (when the row is wider
        // than the kernel, x0 = r and the first tap of pixel x0 is src[0]).
        let x0 = r.min(w);
        let x1 = w.saturating_sub(r).max(x0);
        if x1 > x0 {
            correlate_span(&mut dst[x0 * s..x1 * s], src, taps, s, accumulate);
        }
        for x in (0..x0).chain(x1..w) {
            for ch in 0..s {
                let mut acc = if accumulate { dst[x * s + ch] } else { 0.0 };
                for (j, &t) in taps.iter().enumerate() {
                    let m = self.xmap[x + j];
                    if m >= 0 {
                        acc += t * src[m as usize * s + ch];
                    }
                }
                dst[x * s + ch] = acc;
            }
        }
    }
}

/// `dst[i] (+)= Σ_j taps[j] * src[i + j * step]` for `i` in `0..dst.len()`, j ascending.
/// `src` starts at the first tap of `dst[0]`.
#[inline]
fn correlate_span(dst: &mut [f32], src: &[f32], taps: &[f32], step: usize, accumulate: bool) {
    let len = dst.len();
    if len == 0 {
        return;
    }
    let src = &src[..len + (taps.len() - 1) * step];
    let mut blocks = dst.chunks_exact_mut(BLOCK);
    let mut i = 0;
    for out in &mut blocks {
        let mut acc = [0.0f32; BLOCK];
        if accumulate {
            acc.copy_from_slice(out);
        }
        for (j, &t) in taps.iter().enumerate() {
            let s = &src[i + j * step..i + j * step + BLOCK];
            for l in 0..BLOCK {
                acc[l] += t * s[l];
            }
        }
        out.copy_from_slice(&acc);
        i += BLOCK;
    }
    for (k, out) in blocks.into_remainder().iter_mut().enumerate() {
        let mut acc = if accumulate { *out } else { 0.0 };
        for (j, &t) in taps.iter().enumerate() {
            acc += t * src[i + k + j * step];
        }
        *out = acc;
    }
}

/// `dst[i] = Σ_j taps[j] * plane[row B(y + j - r)][i]`, j ascending, skipping rows of a
/// constant border (`ymap[j] < 0`).
fn vertical_row(dst: &mut [f32], plane: &[f32], row_len: usize, taps: &[f32], ymap: &[i32]) {
    let mut rows: [&[f32]; MAX_TAPS] = [&[]; MAX_TAPS];
    let mut weights = [0.0f32; MAX_TAPS];
    let mut n = 0;
    for (&t, &m) in taps.iter().zip(ymap) {
        if m >= 0 {
            let start = m as usize * row_len;
            rows[n] = &plane[start..start + row_len];
            weights[n] = t;
            n += 1;
        }
    }
    let (rows, weights) = (&rows[..n], &weights[..n]);
    let mut blocks = dst.chunks_exact_mut(BLOCK);
    let mut i = 0;
    for out in &mut blocks {
        let mut acc = [0.0f32; BLOCK];
        for (row, &t) in rows.iter().zip(weights) {
            let s = &row[i..i + BLOCK];
            for l in 0..BLOCK {
                acc[l] += t * s[l];
            }
        }
        out.copy_from_slice(&acc);
        i += BLOCK;
    }
    for (k, out) in blocks.into_remainder().iter_mut().enumerate() {
        let mut acc = 0.0;
        for (row, &t) in rows.iter().zip(weights) {
            acc += t * row[i + k];
        }
        *out = acc;
    }
}

/// The backend's hook: run `conv` (if any) on the f32 tensor after normalization, before
/// the dtype conversion. Returns the time spent in microseconds (0 without conv).
pub(super) fn apply(
    desc: &TensorDesc,
    conv: Option<&Conv2dOp>,
    data: &mut [f32],
    scratch: &mut ConvScratch,
) -> Result<f32> {
    let Some(op) = conv else { return Ok(0.0) };
    let start = std::time::Instant::now();
    conv2d(desc, op, data, scratch)?;
    Ok(start.elapsed().as_secs_f32() * 1e6)
}
