//! The operations, as plain structs shared by both backends, and the one reader and
//! writer of tensor elements ([`read_element`], [`write_element`]). What goes to a kernel
//! by value is `#[repr(C)]` with a C twin in `kernels/common.cuh` (keep in sync; a test
//! checks size and offsets); its layout, dtype and interpolation are the `#[repr(u32)]`
//! enums themselves, so no code can hold (or turn into a default) an unknown one.

use super::Frame;
use crate::config::{Border, DType, Interpolation, Layout};
use crate::error::{Error, Result};
use crate::image::Encoding;

/// Per-axis sampling table: for each destination index `d` in the content rectangle, the
/// two source indices (absolute, in the full image) and the weight of the second, as
/// `cv2.resize` computes them in OpenCV 5.0: `scale = 1 / (dst / src)` in double;
/// linear: `f = (d + 0.5) * scale - 0.5` in double, `s = floor(f)`, weight
/// `(float)(f - s)`, clamped at both edges with weight 0 on the outer tap (`s < 0` ->
/// `s = 0`; `s >= src - 1` -> `s = src - 1`); nearest: `s = min(floor(d * scale),
/// src - 1)`. Both backends sample through these tables, so their coordinates are
/// bit-identical; the CUDA backend uploads them once per size.
///
/// The fraction is taken in double, then rounded to f32: OpenCV's generic `hal::resize`
/// rounds the coordinate to float first (`(float)((d + 0.5) * scale - 0.5)`), but
/// cv2 5.0 as shipped dispatches float images of 2 rows or more to its IPP HAL, whose
/// weights are the double fraction rounded to float (found by experiment with impulse
/// images: e.g. 600 -> 29 columns, d = 1: IPP weight 0.53448278, float-coordinate weight
/// 0.53448296). The double fraction is also the more exact one: with float coordinates
/// a 4000-pixel-wide source would be off by up to 2.4e-4 of a pixel step.
#[derive(Debug, Clone, PartialEq)]
pub struct AxisMap {
    /// First source index of each destination index.
    pub i0: Vec<i32>,
    /// Second source index (== `i0` at the clamped edges and for nearest).
    pub i1: Vec<i32>,
    /// Weight of `i1`; `i0` has weight `1 - w1`.
    pub w1: Vec<f32>,
}

impl AxisMap {
    /// Map `dst_len` destination samples onto the source span `[start, start + src_len)`.
    pub fn new(start: u32, src_len: u32, dst_len: u32, interpolation: Interpolation) -> Self {
        let n = dst_len as usize;
        let mut map = AxisMap {
            i0: Vec::with_capacity(n),
            i1: Vec::with_capacity(n),
            w1: Vec::with_capacity(n),
        };
        let inv_scale = f64::from(dst_len) / f64::from(src_len);
        let scale = 1.0 / inv_scale;
        let last = src_len as i32 - 1;
        for d in 0..dst_len {
            let (s, f) = match interpolation {
                Interpolation::Nearest => {
                    (((f64::from(d) * scale).floor() as i32).min(last), 0.0f32)
                }
                Interpolation::Linear => {
                    // The coordinate and its fraction in double, then the fraction to
                    // f32: what cv2.resize computes in OpenCV 5.0 with its IPP HAL (see
                    // the type's doc).
                    let fd = (f64::from(d) + 0.5) * scale - 0.5;
                    let fl = fd.floor();
                    let mut s = fl as i32;
                    let mut f = (fd - fl) as f32;
                    if s < 0 {
                        s = 0;
                        f = 0.0;
                    }
                    if s >= last {
                        s = last;
                        f = 0.0;
                    }
                    (s, f)
                }
            };
            let (s1, f) = match interpolation {
                Interpolation::Nearest => (s, f),
                Interpolation::Linear => ((s + 1).min(last), f),
            };
            map.i0.push(start as i32 + s);
            map.i1.push(start as i32 + s1);
            map.w1.push(f);
        }
        map
    }

    /// What is wrong with a table of `len` samples on a source axis of `src` pixels, if
    /// anything (part of [`PreprocessOp::check`]).
    fn mismatch(&self, axis: &str, len: u32, src: u32) -> Option<String> {
        let n = len as usize;
        if self.i0.len() != n || self.i1.len() != n || self.w1.len() != n {
            let (i0, i1, w1) = (self.i0.len(), self.i1.len(), self.w1.len());
            return Some(format!("{axis} table lengths {i0}/{i1}/{w1} (i0/i1/w1), expected {n}"));
        }
        let inside = |i: &i32| *i >= 0 && (*i as u32) < src;
        if !self.i0.iter().all(inside) || !self.i1.iter().all(inside) {
            return Some(format!("{axis} table indexes outside 0..{src}"));
        }
        let finite = self.w1.iter().all(|w| w.is_finite());
        (!finite).then(|| format!("{axis} table has non-finite weights"))
    }
}

/// Shape and type of the output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDesc {
    /// Channels (1 or 3).
    pub channels: u32,
    /// Network image height.
    pub height: u32,
    /// Network image width.
    pub width: u32,
    /// Layout.
    pub layout: Layout,
    /// Element type.
    pub dtype: DType,
}

impl TensorDesc {
    /// Elements in the tensor.
    pub fn len(&self) -> usize {
        self.channels as usize * self.height as usize * self.width as usize
    }
    /// True when the tensor has no elements (never, for a validated configuration).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes in the tensor.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype.size()
    }
    /// Dimensions in layout order, batch first.
    pub fn shape(&self) -> [u32; 4] {
        match self.layout {
            Layout::Nchw => [1, self.channels, self.height, self.width],
            Layout::Nhwc => [1, self.height, self.width, self.channels],
        }
    }
    /// Element index of (channel, row, column).
    #[inline]
    pub fn index(&self, c: usize, y: usize, x: usize) -> usize {
        let (h, w, ch) = (self.height as usize, self.width as usize, self.channels as usize);
        match self.layout {
            Layout::Nchw => (c * h + y) * w + x,
            Layout::Nhwc => (y * w + x) * ch + c,
        }
    }
}

/// The fused preprocessing of one frame size, passed to the kernel by value.
/// Keep in sync with `struct PreprocessParams` in `kernels/common.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreprocessParams {
    /// Source width in pixels.
    pub src_width: u32,
    /// Source height in pixels.
    pub src_height: u32,
    /// Source row stride in bytes.
    pub src_step: u32,
    /// `Encoding` discriminant.
    pub encoding: u32,
    /// 1 when 16-bit samples are big-endian.
    pub big_endian: u32,
    /// Network image width.
    pub dst_width: u32,
    /// Network image height.
    pub dst_height: u32,
    /// Content rectangle (where the resampled region lands), left.
    pub content_x: u32,
    /// Content rectangle, top.
    pub content_y: u32,
    /// Content rectangle, width (length of the x sampling table).
    pub content_w: u32,
    /// Content rectangle, height (length of the y sampling table).
    pub content_h: u32,
    /// Output channels, 1 or 3.
    pub channels: u32,
    /// 1 when output channel 0 is blue (channel_order bgr).
    pub swap_rb: u32,
    /// Output layout (a `u32` code for the kernel: `LAYOUT_*`).
    pub layout: Layout,
    /// Output element type (`DTYPE_*`).
    pub dtype: DType,
    /// Interpolation (`INTERP_*`).
    pub interpolation: Interpolation,
    /// Per output channel: `pixel_scale / image_stddev[c]`.
    pub scale: [f32; 3],
    /// Per output channel: `-image_mean[c] / image_stddev[c]`.
    pub bias: [f32; 3],
    /// Per output channel: the normalized padding value.
    pub pad: [f32; 3],
}

impl PreprocessParams {
    /// Take the per-frame fields of the source from `image` (an operation is cached per
    /// frame size; the step, encoding and byte order may change from frame to frame).
    pub fn set_source<'a: 'b, 'b>(&mut self, image: impl Into<Frame<'a, 'b>>) {
        let image = image.into();
        self.src_step = image.step();
        self.encoding = image.encoding() as u32;
        self.big_endian = u32::from(image.big_endian());
    }

    /// The output tensor this operation writes.
    pub fn tensor_desc(&self) -> TensorDesc {
        TensorDesc {
            channels: self.channels,
            height: self.dst_height,
            width: self.dst_width,
            layout: self.layout,
            dtype: self.dtype,
        }
    }
}

/// Element `i` of a dense little-endian tensor of `dtype`, as f32 (float16 widened, which
/// is exact). Panics when `i` is past the end of `bytes`.
#[inline]
pub(crate) fn read_element(dtype: DType, bytes: &[u8], i: usize) -> f32 {
    match dtype {
        DType::Float32 => {
            let b = &bytes[4 * i..4 * i + 4];
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }
        DType::Float16 => half::f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
    }
}

/// Every element of a dense little-endian tensor of `dtype`, as f32.
pub fn read_elements(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    (0..bytes.len() / dtype.size()).map(|i| read_element(dtype, bytes, i)).collect()
}

/// Write `v` as element `i` of a dense little-endian tensor of `dtype` (float16: rounded
/// to nearest even, `half::f16::from_f32`, as the kernels' `cvt.rn.f16.f32`). Panics when
/// `i` is past the end of `out`.
#[inline]
pub(crate) fn write_element(dtype: DType, out: &mut [u8], i: usize, v: f32) {
    match dtype {
        DType::Float32 => out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        DType::Float16 => {
            out[2 * i..2 * i + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
        }
    }
}

/// The fused preprocessing of one frame size: parameters plus sampling tables.
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessOp {
    /// Scalars, passed to the kernel by value.
    pub params: PreprocessParams,
    /// Column table (`content_w` entries).
    pub x_map: AxisMap,
    /// Row table (`content_h` entries).
    pub y_map: AxisMap,
}

impl PreprocessOp {
    /// Check that this operation was built for `image` (source size and per-frame fields
    /// of [`PreprocessParams::set_source`], channels, the content rectangle inside the
    /// network image, the sampling tables: lengths, indexes inside the image, finite
    /// weights), so that no pass reads out of bounds: the one check of the CPU backend
    /// and both CUDA paths, before a frame is touched. A mismatch is the caller's
    /// mistake, [`Error::Operation`], never a device failure.
    pub fn check<'a: 'b, 'b>(&self, image: impl Into<Frame<'a, 'b>>) -> Result<()> {
        self.mismatch(image.into()).map_or(Ok(()), |why| Err(Error::Operation(why)))
    }

    /// What [`PreprocessOp::check`] finds wrong, if anything.
    pub(crate) fn mismatch(&self, image: Frame<'_, '_>) -> Option<String> {
        let p = &self.params;
        if p.src_width != image.width() || p.src_height != image.height() {
            return Some(format!(
                "built for a {}x{} source, image is {}x{}",
                p.src_width,
                p.src_height,
                image.width(),
                image.height()
            ));
        }
        let source = (p.src_step, p.encoding, p.big_endian);
        let frame = (image.step(), image.encoding() as u32, u32::from(image.big_endian()));
        if source != frame {
            let name = |code: u32| {
                Encoding::ALL.get(code as usize).map_or(format!("code {code}"), |e| e.to_string())
            };
            return Some(format!(
                "op.params (src_step, encoding, big_endian) are ({}, {}, {}) but the image has \
                 ({}, {}, {}); call op.params.set_source(&image) for each frame",
                p.src_step,
                name(p.encoding),
                p.big_endian,
                frame.0,
                name(frame.1),
                frame.2
            ));
        }
        if p.channels != 1 && p.channels != 3 {
            return Some(format!("channels {} (1 or 3)", p.channels));
        }
        if p.dst_width == 0 || p.dst_height == 0 {
            return Some(format!("network size {}x{}", p.dst_width, p.dst_height));
        }
        let fits = |o: u32, l: u32, n: u32| u64::from(o) + u64::from(l) <= u64::from(n);
        if p.content_w == 0
            || p.content_h == 0
            || !fits(p.content_x, p.content_w, p.dst_width)
            || !fits(p.content_y, p.content_h, p.dst_height)
        {
            return Some(format!(
                "content [{}, {}, {}, {}] not inside the {}x{} network image",
                p.content_x, p.content_y, p.content_w, p.content_h, p.dst_width, p.dst_height
            ));
        }
        let x = self.x_map.mismatch("x", p.content_w, image.width());
        x.or_else(|| self.y_map.mismatch("y", p.content_h, image.height()))
    }
}

/// conv2d on each channel of the normalized network image (correlation, like
/// `cv2.filter2D`), before the output dtype conversion. Built by
/// `pipeline::conv::conv_op`; semantics in `docs/SPEC_conv2d.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct Conv2dOp {
    /// Odd kernel size, 1..=15 (the size applied: 3 for sobel/laplacian `conv.size: 1`).
    pub size: u32,
    /// `size * size` weights, row-major: `weights[ky * size + kx]` multiplies the pixel at
    /// `(y + ky - size/2, x + kx - size/2)` (no flip). Used by the direct 2-D path.
    pub weights: Vec<f32>,
    /// `(kx, ky)` when the kernel is their outer product (`weights[r * size + c] =
    /// ky[r] * kx[c]`, each factor rounded to f32 on its own): `kx` is the horizontal
    /// pass along each row (first), `ky` the vertical pass (second). `None`: direct 2-D.
    pub separable: Option<(Vec<f32>, Vec<f32>)>,
    /// Border handling (`cv::borderInterpolate`).
    pub border: Border,
}

impl Conv2dOp {
    /// Largest kernel size (`config::MAX_CONV_SIZE`).
    pub(crate) const MAX_SIZE: u32 = crate::config::MAX_CONV_SIZE;

    /// Kernel radius, `size / 2`.
    pub(crate) fn radius(&self) -> usize {
        self.size as usize / 2
    }

    /// `Σ|w|` of the 2-D weights: the gain from the input's error (or magnitude) to the
    /// output's; the conv tolerance of the tests scales with it.
    pub fn l1_norm(&self) -> f64 {
        self.weights.iter().map(|w| f64::from(w.abs())).sum()
    }

    /// Check the invariants the backends rely on (odd size 1..=15, weight counts).
    pub fn check(&self) -> Result<()> {
        let n = self.size as usize;
        let bad = |what: String| {
            Err(Error::config(
                "conv",
                what,
                format!(
                    "use an odd size 1..={} with size*size weights (and size taps per separable \
                     factor)",
                    Self::MAX_SIZE
                ),
            ))
        };
        if self.size.is_multiple_of(2) || self.size > Self::MAX_SIZE {
            return bad(format!("size {}", self.size));
        }
        if self.weights.len() != n * n {
            return bad(format!("{} weights for size {n}", self.weights.len()));
        }
        if let Some((kx, ky)) = &self.separable {
            if kx.len() != n || ky.len() != n {
                return bad(format!(
                    "separable factors of {} and {} taps for size {n}",
                    kx.len(),
                    ky.len()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_weights_are_the_double_fraction_rounded_once() {
        // 600 -> 29, d = 1: (1 + 0.5) * 600/29 - 0.5 = 30.53448275862069 in double; the
        // fraction 0.53448275862069 as f32 is 0.5344828, the weight cv2.resize 5.0 uses
        // (read off an impulse image: np.zeros((2, 600), np.float32) with column 31 = 1,
        // cv2.resize(.., (29, 2))[0, 1] -> 0.5344828). Rounding the coordinate to float
        // first would give 30.534483 -> 0.53448296.
        let m = AxisMap::new(0, 600, 29, Interpolation::Linear);
        assert_eq!((m.i0[1], m.i1[1]), (30, 31));
        assert_eq!(m.w1[1], 0.534_482_8_f32);
        assert_ne!(m.w1[1], 0.534_482_96_f32);
    }

    #[test]
    fn elements_round_trip_through_both_dtypes() {
        let mut b = vec![0u8; 8];
        write_element(DType::Float32, &mut b, 1, -1.5);
        assert_eq!(&b[4..], &(-1.5f32).to_le_bytes());
        assert_eq!(read_elements(DType::Float32, &b), vec![0.0, -1.5]);
        // 1/3 in float16 is 0x3555 = 0.333251953125 (round to nearest even).
        write_element(DType::Float16, &mut b, 3, 1.0 / 3.0);
        assert_eq!(&b[6..], &0x3555u16.to_le_bytes());
        assert_eq!(read_element(DType::Float16, &b, 3), 0.333_251_95);
        assert_eq!(read_elements(DType::Float16, &b).len(), 4);
    }

    #[test]
    fn tensor_index_and_shape_follow_the_layout() {
        let mut d = TensorDesc {
            channels: 3,
            height: 2,
            width: 4,
            layout: Layout::Nchw,
            dtype: DType::Float16,
        };
        // NCHW: (c * H + y) * W + x = (2 * 2 + 1) * 4 + 3 = 23.
        assert_eq!(d.index(2, 1, 3), 23);
        assert_eq!(d.shape(), [1, 3, 2, 4]);
        assert_eq!(d.byte_len(), 48);
        d.layout = Layout::Nhwc;
        // NHWC: (y * W + x) * C + c = (1 * 4 + 3) * 3 + 2 = 23 too; (0, 1, 0) differs: 12 vs 4.
        assert_eq!(d.index(2, 1, 3), 23);
        assert_eq!((d.index(0, 1, 0), d.shape()), (12, [1, 2, 4, 3]));
    }
}
