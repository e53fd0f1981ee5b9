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
pub(crate) fn border_index(p: i64, len: usize, border: Border) -> Option<usize> {
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
                .for_each(|(dst, src)| cols.correlate_rows(dst, &[src], &[&kx[..]]));
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
                full_row(&cols, dst, (src, row_len), op, &ymap[y..y + size]);
            });
        }
    }
    Ok(())
}

/// One output row `dst` of a full (not separable) kernel: `src` is its plane of rows of
/// `row_len`, `ymap` the source rows of kernel rows 0..size.
fn full_row(
    cols: &Columns<'_>,
    dst: &mut [f32],
    (src, row_len): (&[f32], usize),
    op: &Conv2dOp,
    ymap: &[i32],
) {
    let size = op.size as usize;
    // The source rows of kernel rows ky = 0..size (skipping those a constant border reads
    // as 0), with their taps: fixed arrays, no allocation.
    let mut rows: [&[f32]; MAX_TAPS] = [&[]; MAX_TAPS];
    let mut taps: [&[f32]; MAX_TAPS] = [&[]; MAX_TAPS];
    let mut n = 0;
    for (ky, &m) in ymap.iter().enumerate() {
        if m >= 0 {
            rows[n] = &src[m as usize * row_len..(m as usize + 1) * row_len];
            taps[n] = &op.weights[ky * size..(ky + 1) * size];
            n += 1;
        }
    }
    cols.correlate_rows(dst, &rows[..n], &taps[..n]);
}

/// The horizontal geometry of a row.
struct Columns<'a> {
    width: usize,
    stride: usize,
    radius: usize,
    xmap: &'a [i32],
}

impl Columns<'_> {
    /// `dst[x] = Σ_k Σ_j taps[k][j] * rows[k][B(x + j - r)]` (k, then j ascending) for every
    /// pixel `x` of the row (each of its `stride` channels): the interior (all taps inside
    /// the row) in vector blocks, the `r` pixels at each end through the border table.
    fn correlate_rows(&self, dst: &mut [f32], rows: &[&[f32]], taps: &[&[f32]]) {
        let (w, s, r) = (self.width, self.stride, self.radius);
        // Interior pixels [x0, x1): when the row is wider than the kernel, x0 = r and the
        // first tap of pixel x0 is element 0 of each row.
        let x0 = r.min(w);
        let x1 = w.saturating_sub(r).max(x0);
        if x1 > x0 {
            correlate_span(&mut dst[x0 * s..x1 * s], rows, taps, s);
        }
        for x in (0..x0).chain(x1..w) {
            for ch in 0..s {
                let mut acc = 0.0f32;
                for (row, t) in rows.iter().zip(taps) {
                    for (j, &wt) in t.iter().enumerate() {
                        let m = self.xmap[x + j];
                        if m >= 0 {
                            acc += wt * row[m as usize * s + ch];
                        }
                    }
                }
                dst[x * s + ch] = acc;
            }
        }
    }
}

/// `dst[i] = Σ_k Σ_j taps[k][j] * rows[k][i + j * step]` for `i` in `0..dst.len()`, k then
/// j ascending, accumulated in registers a block at a time. Each row starts at the first
/// tap of `dst[0]`.
#[inline]
fn correlate_span(dst: &mut [f32], rows: &[&[f32]], taps: &[&[f32]], step: usize) {
    let mut blocks = dst.chunks_exact_mut(BLOCK);
    let mut i = 0;
    for out in &mut blocks {
        let mut acc = [0.0f32; BLOCK];
        for (row, t) in rows.iter().zip(taps) {
            for (j, &wt) in t.iter().enumerate() {
                let s = &row[i + j * step..i + j * step + BLOCK];
                for l in 0..BLOCK {
                    acc[l] += wt * s[l];
                }
            }
        }
        out.copy_from_slice(&acc);
        i += BLOCK;
    }
    for (k, out) in blocks.into_remainder().iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (row, t) in rows.iter().zip(taps) {
            for (j, &wt) in t.iter().enumerate() {
                acc += wt * row[i + k + j * step];
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ConvConfig, ConvKernel, DType};
    use crate::pipeline::conv::{conv_op, kernel_f64, KernelF64};

    const BORDERS: [Border; 3] = [Border::Replicate, Border::Constant, Border::Reflect101];

    /// A tolerance of `test/tolerances.json` (the one place they are named; JSON is YAML).
    fn tolerance(key: &str) -> f64 {
        let t: std::collections::HashMap<String, serde_yaml::Value> =
            serde_yaml::from_str(include_str!("../../../test/tolerances.json")).unwrap();
        t[key].as_f64().unwrap()
    }

    /// The conv tolerance: `conv_float32_abs_per_l1 * max(1, Σ|w|)`.
    fn conv_tolerance(op: &Conv2dOp) -> f64 {
        tolerance("conv_float32_abs_per_l1") * op.l1_norm().max(1.0)
    }

    /// Deterministic values in [-1, 1) (xorshift64*), the range of normalized pixels.
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                let v = s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
                (v as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn desc(c: u32, h: u32, w: u32, layout: Layout) -> TensorDesc {
        TensorDesc { channels: c, height: h, width: w, layout, dtype: DType::Float32 }
    }

    fn cfg(kernel: ConvKernel, size: u32, sigma: f64, border: Border) -> ConvConfig {
        let weights = if kernel == ConvKernel::Custom {
            noise((size * size) as usize, u64::from(size) + 7)
                .iter()
                .map(|&v| f64::from(v))
                .collect()
        } else {
            Vec::new()
        };
        ConvConfig { kernel, size, sigma, weights, border }
    }

    fn op_of(conv: &ConvConfig) -> Conv2dOp {
        conv_op(&Config { conv: conv.clone(), ..Config::default() }).unwrap().unwrap()
    }

    fn run(d: &TensorDesc, op: &Conv2dOp, input: &[f32]) -> Vec<f32> {
        let mut data = input.to_vec();
        conv2d(d, op, &mut data, &mut ConvScratch::default()).unwrap();
        data
    }

    /// Every kernel at every size it takes (custom with fixed pseudo-random weights).
    fn all_configs(border: Border) -> Vec<ConvConfig> {
        use ConvKernel::*;
        let mut v = Vec::new();
        for size in [1, 3, 5, 7, 9, 15] {
            for (kernel, sigma) in [
                (Box, 0.0),
                (Gaussian, 0.0),
                (Gaussian, 1.7),
                (Sharpen, 0.0),
                (SobelX, 0.0),
                (SobelY, 0.0),
                (Laplacian, 0.0),
                (Custom, 0.0),
            ] {
                v.push(cfg(kernel, size, sigma, border));
            }
        }
        v
    }

    /// OpenCV's `borderInterpolate`, transcribed literally (the do-while loop); -1 for
    /// the constant border.
    fn opencv_border_interpolate(mut p: i64, len: i64, border: Border) -> i64 {
        if (0..len).contains(&p) {
            return p;
        }
        match border {
            Border::Replicate => {
                if p < 0 {
                    0
                } else {
                    len - 1
                }
            }
            Border::Constant => -1,
            Border::Reflect101 => {
                if len == 1 {
                    return 0;
                }
                loop {
                    if p < 0 {
                        p = -p - 1 + 1;
                    } else {
                        p = len - 1 - (p - len) - 1;
                    }
                    if (0..len).contains(&p) {
                        return p;
                    }
                }
            }
        }
    }

    /// The per-element definition of the module doc, NCHW, f32, in the documented order.
    fn definition(d: &TensorDesc, op: &Conv2dOp, input: &[f32]) -> Vec<f32> {
        let (c, h, w) = (d.channels as usize, d.height as usize, d.width as usize);
        let (n, r) = (op.size as usize, op.radius() as i64);
        let at = |plane: &[f32], y: i64, x: i64| -> Option<f32> {
            let y = border_index(y, h, op.border)?;
            let x = border_index(x, w, op.border)?;
            Some(plane[y * w + x])
        };
        let mut out = vec![0.0f32; input.len()];
        for ch in 0..c {
            let plane = &input[ch * h * w..(ch + 1) * h * w];
            for y in 0..h as i64 {
                for x in 0..w as i64 {
                    let mut acc = 0.0f32;
                    match &op.separable {
                        None => {
                            for ky in 0..n as i64 {
                                for kx in 0..n as i64 {
                                    if let Some(v) = at(plane, y + ky - r, x + kx - r) {
                                        acc += op.weights[(ky * n as i64 + kx) as usize] * v;
                                    }
                                }
                            }
                        }
                        Some((fx, fy)) => {
                            for (i, &wy) in fy.iter().enumerate() {
                                let Some(sy) = border_index(y + i as i64 - r, h, op.border) else {
                                    continue;
                                };
                                let mut t = 0.0f32;
                                for (j, &wx) in fx.iter().enumerate() {
                                    if let Some(v) = at(plane, sy as i64, x + j as i64 - r) {
                                        t += wx * v;
                                    }
                                }
                                acc += wy * t;
                            }
                        }
                    }
                    out[ch * h * w + (y as usize) * w + x as usize] = acc;
                }
            }
        }
        out
    }

    /// The same in f64 with the f64 kernel (weights before their f32 rounding).
    fn reference_f64(d: &TensorDesc, k: &KernelF64, border: Border, input: &[f32]) -> Vec<f64> {
        let (c, h, w) = (d.channels as usize, d.height as usize, d.width as usize);
        let (n, r) = (k.size, (k.size / 2) as i64);
        let mut out = vec![0.0f64; input.len()];
        for ch in 0..c {
            for y in 0..h as i64 {
                for x in 0..w as i64 {
                    let mut acc = 0.0f64;
                    for ky in 0..n {
                        for kx in 0..n {
                            let sy = border_index(y + ky as i64 - r, h, border);
                            let sx = border_index(x + kx as i64 - r, w, border);
                            if let (Some(sy), Some(sx)) = (sy, sx) {
                                acc += k.weights[ky * n + kx]
                                    * f64::from(input[ch * h * w + sy * w + sx]);
                            }
                        }
                    }
                    out[ch * h * w + y as usize * w + x as usize] = acc;
                }
            }
        }
        out
    }

    #[test]
    fn border_index_is_opencv_border_interpolate() {
        // The diagrams of OpenCV's BorderTypes doc, on "abcdefgh" (len 8), p = -4..12:
        let show = |border| -> String {
            (-4..12)
                .map(|p| border_index(p, 8, border).map_or('0', |i| (b'a' + i as u8) as char))
                .collect()
        };
        assert_eq!(show(Border::Replicate), "aaaaabcdefghhhhh"); // aaaa|abcdefgh|hhhh
        assert_eq!(show(Border::Reflect101), "edcbabcdefghgfed"); // edcb|abcdefgh|gfed
        assert_eq!(show(Border::Constant), "0000abcdefgh0000"); // 0000|abcdefgh|0000
                                                                // Kernels wider than the image reflect again: len 3 "abc", p = -7..10:
                                                                // cbabcbabc|abc|bab cbab... period 2*(3-1) = 4.
        let s: String = (-7..10)
            .map(|p| (b'a' + border_index(p, 3, Border::Reflect101).unwrap() as u8) as char)
            .collect();
        assert_eq!(s, "bcbabcbabcbabcbab");
        // A 1-pixel axis: OpenCV returns 0 for reflect101 (as replicate).
        for p in -7..8 {
            assert_eq!(border_index(p, 1, Border::Reflect101), Some(0));
            assert_eq!(border_index(p, 1, Border::Replicate), Some(0));
        }
        // len 2 "ab": reflect101 alternates: p = -3..5 -> b a b | a b | a b a
        let s: String = (-3..5)
            .map(|p| (b'a' + border_index(p, 2, Border::Reflect101).unwrap() as u8) as char)
            .collect();
        assert_eq!(s, "babababa");
        // The closed form equals OpenCV's loop everywhere a 15x15 kernel can reach.
        for len in 1..=20i64 {
            for p in -30..len + 30 {
                for b in BORDERS {
                    let want = opencv_border_interpolate(p, len, b);
                    let got = border_index(p, len as usize, b).map_or(-1, |v| v as i64);
                    assert_eq!(got, want, "p {p} len {len} {b:?}");
                }
            }
        }
    }

    #[test]
    fn golden_values() {
        let tol = tolerance("float32_abs");
        let d = desc(1, 1, 3, Layout::Nchw);
        let close = |got: &[f32], want: &[f64]| {
            for (g, w) in got.iter().zip(want) {
                assert!((f64::from(*g) - w).abs() <= tol, "{got:?} vs {want:?}");
            }
        };
        // box 3 on the 1x3 image [1, 2, 3]:
        // replicate: every row reads row 0; x=0 (1+1+2)/3, x=1 (1+2+3)/3, x=2 (2+3+3)/3.
        //   cv2.blur(np.float64([[1,2,3]]), (3,3), borderType=cv2.BORDER_REPLICATE)
        //   -> [[1.3333, 2.0, 2.6667]]
        let input = [1.0, 2.0, 3.0];
        let k = |b| op_of(&cfg(ConvKernel::Box, 3, 0.0, b));
        close(&run(&d, &k(Border::Replicate), &input), &[4.0 / 3.0, 2.0, 8.0 / 3.0]);
        // constant: rows -1 and 1 read 0, so 1/3 of the row means (0+1+2)/3, 6/3, (2+3+0)/3.
        //   cv2.blur(..., borderType=cv2.BORDER_CONSTANT) -> [[0.3333, 0.6667, 0.5556]]
        close(&run(&d, &k(Border::Constant), &input), &[1.0 / 3.0, 2.0 / 3.0, 5.0 / 9.0]);
        // reflect101: 1-pixel axis reads row 0; x=-1 reads x=1: (2+1+2)/3, 2, (2+3+2)/3.
        //   cv2.blur(..., borderType=cv2.BORDER_REFLECT_101) -> [[1.6667, 2.0, 2.3333]]
        close(&run(&d, &k(Border::Reflect101), &input), &[5.0 / 3.0, 2.0, 7.0 / 3.0]);

        // Correlation, not convolution: an impulse returns the kernel flipped.
        //   cv2.filter2D(np.pad(np.float64([[1]]), 1), -1, np.arange(9.).reshape(3, 3),
        //                borderType=cv2.BORDER_CONSTANT) -> [[8,7,6],[5,4,3],[2,1,0]]
        let mut c = cfg(ConvKernel::Custom, 3, 0.0, Border::Constant);
        c.weights = (0..9).map(f64::from).collect();
        let impulse = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let got = run(&desc(1, 3, 3, Layout::Nchw), &op_of(&c), &impulse);
        assert_eq!(got, [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]);

        // sobel_x 3 on the ramp in[y][x] = x (3x3, replicate): horizontal [-1, 0, 1]
        // gives x=0: 1-0, x=1: 2-0, x=2: 2-1; vertical [1, 2, 1] multiplies by 4.
        //   cv2.Sobel(np.float64([[0,1,2]]*3), cv2.CV_64F, 1, 0, ksize=3,
        //             borderType=cv2.BORDER_REPLICATE) -> [[4, 8, 4]]*3
        let ramp = [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0, 2.0];
        let sx = op_of(&cfg(ConvKernel::SobelX, 3, 0.0, Border::Replicate));
        assert_eq!(
            run(&desc(1, 3, 3, Layout::Nchw), &sx, &ramp),
            [4.0, 8.0, 4.0, 4.0, 8.0, 4.0, 4.0, 8.0, 4.0]
        );
        // laplacian 1 = [[0,1,0],[1,-4,1],[0,1,0]] on the same ramp with reflect101:
        // out = up + down + left + right - 4*centre, up = down = x; x=-1 reads x=1 and
        // x=3 reads x=1: x=0: 0+0 + 1+1 - 0 = 2; x=1: 1+1 + 0+2 - 4 = 0;
        // x=2: 2+2 + 1+1 - 8 = -2.
        //   cv2.Laplacian(ramp, cv2.CV_64F, ksize=1, borderType=cv2.BORDER_REFLECT_101)
        //   -> [[2, 0, -2]]*3
        let lap = op_of(&cfg(ConvKernel::Laplacian, 1, 0.0, Border::Reflect101));
        assert_eq!(
            run(&desc(1, 3, 3, Layout::Nchw), &lap, &ramp),
            [2.0, 0.0, -2.0, 2.0, 0.0, -2.0, 2.0, 0.0, -2.0]
        );

        // A 15x15 gaussian on a 1x1 image: reflect101 and replicate read the pixel at
        // every tap (Σw = 1); constant reads it only at the centre, weight g[7]².
        let one = desc(1, 1, 1, Layout::Nchw);
        for b in [Border::Replicate, Border::Reflect101] {
            close(&run(&one, &op_of(&cfg(ConvKernel::Gaussian, 15, 0.0, b)), &[0.5]), &[0.5]);
        }
        let g = crate::pipeline::conv::gaussian_1d(15, 0.0);
        let c15 = op_of(&cfg(ConvKernel::Gaussian, 15, 0.0, Border::Constant));
        close(&run(&one, &c15, &[0.5]), &[0.5 * g[7] * g[7]]);
    }

    #[test]
    fn fast_paths_equal_the_per_element_definition_exactly() {
        let sizes = [(1, 1), (1, 9), (9, 1), (2, 2), (3, 3), (5, 17), (16, 33), (7, 40)];
        let mut cases = 0;
        for border in BORDERS {
            for conv in all_configs(border) {
                let op = op_of(&conv);
                for (h, w) in sizes {
                    let d = desc(3, h, w, Layout::Nchw);
                    let input = noise(d.len(), u64::from(h * 100 + w));
                    let got = run(&d, &op, &input);
                    let want = definition(&d, &op, &input);
                    assert!(
                        got == want,
                        "{:?} size {} {border:?} on {h}x{w}: first difference at {:?}",
                        conv.kernel,
                        conv.size,
                        got.iter().zip(&want).position(|(a, b)| a != b)
                    );
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 3 * 48 * 8);
    }

    #[test]
    fn within_conv_tolerance_of_f64() {
        for border in BORDERS {
            for conv in all_configs(border) {
                let op = op_of(&conv);
                let k = kernel_f64(&conv).unwrap().unwrap();
                let d = desc(2, 13, 21, Layout::Nchw);
                let input = noise(d.len(), 3);
                let got = run(&d, &op, &input);
                let want = reference_f64(&d, &k, border, &input);
                let tol = conv_tolerance(&op);
                let (i, diff) = got
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| (f64::from(*g) - w).abs())
                    .enumerate()
                    .fold((0, 0.0), |m, (i, e)| if e > m.1 { (i, e) } else { m });
                assert!(
                    diff <= tol,
                    "{:?} size {} {border:?}: max diff {diff:.3e} at {i} > tol {tol:.3e} \
                     (cpu {} vs f64 {})",
                    conv.kernel,
                    conv.size,
                    got[i],
                    want[i]
                );
            }
        }
    }

    #[test]
    fn nhwc_equals_nchw_exactly() {
        let (c, h, w) = (3usize, 11usize, 19usize);
        let planar = noise(c * h * w, 9);
        let mut interleaved = vec![0.0; planar.len()];
        for ch in 0..c {
            for i in 0..h * w {
                interleaved[i * c + ch] = planar[ch * h * w + i];
            }
        }
        for border in BORDERS {
            for conv in all_configs(border) {
                let op = op_of(&conv);
                let a = run(&desc(3, h as u32, w as u32, Layout::Nchw), &op, &planar);
                let b = run(&desc(3, h as u32, w as u32, Layout::Nhwc), &op, &interleaved);
                for ch in 0..c {
                    for i in 0..h * w {
                        assert_eq!(
                            a[ch * h * w + i],
                            b[i * c + ch],
                            "{:?} {}",
                            conv.kernel,
                            conv.size
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn scratch_is_reused_across_frames() {
        let op = op_of(&cfg(ConvKernel::Gaussian, 5, 0.0, Border::Reflect101));
        let direct = op_of(&cfg(ConvKernel::Sharpen, 5, 0.0, Border::Reflect101));
        let mut scratch = ConvScratch::default();
        let big = desc(3, 40, 50, Layout::Nchw);
        let small = desc(1, 3, 7, Layout::Nhwc);
        let mut cap = 0;
        for (i, d) in [big, small, big, small, big].iter().enumerate() {
            for op in [&op, &direct] {
                let input = noise(d.len(), i as u64);
                let mut data = input.clone();
                conv2d(d, op, &mut data, &mut scratch).unwrap();
                assert_eq!(data, run(d, op, &input));
            }
            if i == 0 {
                cap = scratch.tmp.capacity();
            }
            assert_eq!(scratch.tmp.capacity(), cap, "no reallocation after the first frame");
        }
    }

    #[test]
    fn bad_operations_are_errors() {
        let mut op = op_of(&cfg(ConvKernel::Box, 3, 0.0, Border::Replicate));
        let d = desc(1, 4, 4, Layout::Nchw);
        let e = conv2d(&d, &op, &mut [0.0; 15], &mut ConvScratch::default()).unwrap_err();
        assert!(e.to_string().starts_with("parameter `conv`: a buffer of 15 values is invalid; the tensor [1, 1, 4, 4] has 16 values"), "{e}");
        op.size = 4;
        let e = conv2d(&d, &op, &mut [0.0; 16], &mut ConvScratch::default()).unwrap_err();
        assert!(e.to_string().starts_with("parameter `conv`: size 4 is invalid"), "{e}");
        op.size = 5;
        let e = conv2d(&d, &op, &mut [0.0; 16], &mut ConvScratch::default()).unwrap_err();
        assert!(
            e.to_string().starts_with("parameter `conv`: 9 weights for size 5 is invalid"),
            "{e}"
        );
    }

    #[test]
    fn backend_convolves_after_normalize_before_float16() {
        use crate::backend::cpu::CpuBackend;
        use crate::image::ImageView;
        use crate::pipeline::Pipeline;
        // A 7x5 rgb8 gradient, stretched to 9x6 (nothing special: any pre-conv tensor).
        let (w, h) = (7u32, 5u32);
        let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
        let image = ImageView::new(w, h, w * 3, "rgb8", false, &pixels).unwrap();
        let base = Config {
            network_image_width: 9,
            network_image_height: 6,
            resize_mode: crate::config::ResizeMode::Stretch,
            ..Config::default()
        };
        let conv = cfg(ConvKernel::Sharpen, 3, 0.0, Border::Reflect101);
        for (layout, dtype) in [
            (Layout::Nchw, DType::Float32),
            (Layout::Nhwc, DType::Float32),
            (Layout::Nchw, DType::Float16),
        ] {
            let plain = Config { output_layout: layout, ..base.clone() };
            let mut p = Pipeline::new(plain, Box::new(CpuBackend::new())).unwrap();
            let info = p.process(&image).unwrap();
            let mut want: Vec<f32> = p
                .tensor_bytes()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            conv2d(&info.desc, &op_of(&conv), &mut want, &mut ConvScratch::default()).unwrap();
            let with_conv = Config {
                output_layout: layout,
                output_dtype: dtype,
                conv: conv.clone(),
                ..base.clone()
            };
            let mut p = Pipeline::new(with_conv, Box::new(CpuBackend::new())).unwrap();
            let info = p.process(&image).unwrap();
            assert!(info.times.conv_us > 0.0);
            let got: Vec<f32> = match dtype {
                DType::Float32 => p
                    .tensor_bytes()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                DType::Float16 => p
                    .tensor_bytes()
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            };
            let want: Vec<f32> = match dtype {
                DType::Float32 => want,
                // float16 rounding after conv: round the f32 result once.
                DType::Float16 => want.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect(),
            };
            assert_eq!(got, want, "{layout:?} {dtype:?}");
        }
    }

    /// Speed figure, not a test: `cargo test --release --no-default-features --lib
    /// conv_speed -- --ignored --nocapture`. 640x640x3 f32 NCHW, median of 50 frames.
    #[test]
    #[ignore = "speed figure; run explicitly"]
    fn conv_speed() {
        let d = desc(3, 640, 640, Layout::Nchw);
        let input = noise(d.len(), 1);
        let mut custom = cfg(ConvKernel::Custom, 7, 0.0, Border::Reflect101);
        custom.weights = noise(49, 5).iter().map(|&v| f64::from(v)).collect();
        for (name, conv) in [
            ("gaussian 5x5 (separable)", cfg(ConvKernel::Gaussian, 5, 0.0, Border::Reflect101)),
            ("custom 7x7 (direct)", custom),
        ] {
            let op = op_of(&conv);
            let mut scratch = ConvScratch::default();
            let mut data = input.clone();
            conv2d(&d, &op, &mut data, &mut scratch).unwrap();
            let mut times: Vec<f64> = (0..50)
                .map(|_| {
                    data.copy_from_slice(&input);
                    let t = std::time::Instant::now();
                    conv2d(&d, &op, &mut data, &mut scratch).unwrap();
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            times.sort_by(f64::total_cmp);
            println!(
                "conv2d 640x640x3 f32 {name}: median {:.2} ms, min {:.2} ms ({} rayon threads)",
                times[25],
                times[0],
                rayon::current_num_threads()
            );
        }
    }
}
