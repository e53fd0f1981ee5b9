//! Decoding of every supported encoding, one source pixel at a time, to RGB (or grey) in
//! 8-bit units, bit-exact with OpenCV 5.0's `cv2.cvtColor` (the u8 values OpenCV
//! produces, including its fixed-point rounding and its Bayer border rules).
//!
//! This file is the one the CUDA kernels mirror (`kernels/common.cuh`): each function
//! is a pure function of the source bytes and the pixel coordinate, so a kernel thread
//! can decode exactly the samples it needs. The formula and the OpenCV code that defines
//! each encoding are written next to it; `docs/SPEC.md` has the same table.
//!
//! Values are returned as `f32` in 8-bit units: exact integers for 8-bit encodings, the
//! 16-bit sample divided by 257.0 (correctly rounded f32 division, no rounding to an
//! integer) for 16-bit ones, so 65535 -> 255.0.
//!
//! Every [`Source`] reads rows of a validated [`ImageView`]; the pixel coordinates come
//! from sampling tables checked against the image size before the pass starts
//! (`PreprocessOp::check`), so the slice indexing here cannot fail.

use crate::image::ImageView;

// ---------------------------------------------------------------------------------
// Shared integer arithmetic.
// ---------------------------------------------------------------------------------

/// ITU-R BT.601 limited-range YUV -> RGB in 20-bit fixed point, OpenCV's constants
/// (`modules/imgproc/src/color_yuv.simd.hpp`: `ITUR_BT_601_CY` ... `ITUR_BT_601_SHIFT`).
pub(crate) mod bt601 {
    /// 1.164 * 2^20 (luma gain, 255/219).
    pub(crate) const CY: i32 = 1_220_542;
    /// 2.018 * 2^20 (U -> B).
    pub(crate) const CUB: i32 = 2_116_026;
    /// -0.391 * 2^20 (U -> G).
    pub(crate) const CUG: i32 = -409_993;
    /// -0.813 * 2^20 (V -> G).
    pub(crate) const CVG: i32 = -852_492;
    /// 1.596 * 2^20 (V -> R).
    pub(crate) const CVR: i32 = 1_673_527;
    /// Fixed-point shift.
    pub(crate) const SHIFT: i32 = 20;
}

/// One YUV sample to RGB, as OpenCV's `uvToRGBuv` + `yRGBuvToRGBA`:
///
/// ```text
/// uu = u - 128, vv = v - 128, half = 1 << 19
/// ruv = half + CVR*vv;  guv = half + CVG*vv + CUG*uu;  buv = half + CUB*uu
/// yy  = max(0, y - 16) * CY
/// R = sat_u8((yy + ruv) >> 20);  G = sat_u8((yy + guv) >> 20);  B = sat_u8((yy + buv) >> 20)
/// ```
///
/// (`>>` is arithmetic; the largest |sum| is < 2^29, no overflow.) Checked against
/// `cv2.cvtColor(.., COLOR_YUV2RGB_YUY2)` for all 2^24 (y, u, v) triples.
#[cfg(test)]
#[inline(always)]
pub(crate) fn yuv_to_rgb(y: u8, u: u8, v: u8) -> [u8; 3] {
    use bt601::*;
    let uu = i32::from(u) - 128;
    let vv = i32::from(v) - 128;
    let half = 1 << (SHIFT - 1);
    let ruv = half + CVR * vv;
    let guv = half + CVG * vv + CUG * uu;
    let buv = half + CUB * uu;
    let yy = (i32::from(y) - 16).max(0) * CY;
    [sat_u8((yy + ruv) >> SHIFT), sat_u8((yy + guv) >> SHIFT), sat_u8((yy + buv) >> SHIFT)]
}

/// [`yuv_to_rgb`] through tables (the CPU's fast path; a test checks all 2^24 inputs
/// give the same bytes): every product of the formula is a function of one byte, and the
/// saturation is a table of the shifted sum, so a pixel costs a few loads and adds.
pub(crate) struct YuvLut {
    /// `max(0, y - 16) * CY`.
    y: [i32; 256],
    /// `half + CVR * (v - 128)`.
    rv: [i32; 256],
    /// `half + CUG * (u - 128)`.
    gu: [i32; 256],
    /// `CVG * (v - 128)`.
    gv: [i32; 256],
    /// `half + CUB * (u - 128)`.
    bu: [i32; 256],
    /// `sat_u8(i - SAT_OFFSET)` for `i` in `0..SAT_LEN`.
    sat: [u8; YuvLut::SAT_LEN],
}

impl YuvLut {
    /// The shifted sums lie in -259..=536; indices are offset by 1024 into a power-of-two
    /// table, masked, so no index can be out of bounds.
    const SAT_OFFSET: i32 = 1024;
    const SAT_LEN: usize = 2048;

    const fn new() -> Self {
        use bt601::*;
        let half = 1 << (SHIFT - 1);
        let mut t = YuvLut {
            y: [0; 256],
            rv: [0; 256],
            gu: [0; 256],
            gv: [0; 256],
            bu: [0; 256],
            sat: [0; YuvLut::SAT_LEN],
        };
        let mut i = 0;
        while i < 256 {
            let c = i as i32 - 128;
            let l = i as i32 - 16;
            t.y[i] = if l > 0 { l * CY } else { 0 };
            t.rv[i] = half + CVR * c;
            t.gu[i] = half + CUG * c;
            t.gv[i] = CVG * c;
            t.bu[i] = half + CUB * c;
            i += 1;
        }
        let mut j = 0;
        while j < YuvLut::SAT_LEN {
            let v = j as i32 - YuvLut::SAT_OFFSET;
            t.sat[j] = if v < 0 {
                0
            } else if v > 255 {
                255
            } else {
                v as u8
            };
            j += 1;
        }
        t
    }

    #[inline(always)]
    fn sat(&self, sum: i32) -> u8 {
        self.sat[((sum >> bt601::SHIFT) + Self::SAT_OFFSET) as usize & (Self::SAT_LEN - 1)]
    }

    /// Two horizontally adjacent pixels sharing one chroma pair (4:2:2 and 4:2:0).
    #[inline(always)]
    pub(crate) fn pair(&self, y0: u8, y1: u8, u: u8, v: u8) -> [[u8; 3]; 2] {
        let (ruv, guv, buv) =
            (self.rv[v as usize], self.gu[u as usize] + self.gv[v as usize], self.bu[u as usize]);
        let px = |y: u8| {
            let yy = self.y[y as usize];
            [self.sat(yy + ruv), self.sat(yy + guv), self.sat(yy + buv)]
        };
        [px(y0), px(y1)]
    }

    /// One pixel.
    #[inline(always)]
    pub(crate) fn rgb(&self, y: u8, u: u8, v: u8) -> [u8; 3] {
        self.pair(y, y, u, v)[0]
    }
}

/// The tables of [`YuvLut`], built at compile time.
pub(crate) static YUV_LUT: YuvLut = YuvLut::new();

/// Two horizontally adjacent pixels sharing one chroma pair: the same values as two
/// calls of [`yuv_to_rgb`].
#[inline(always)]
pub(crate) fn yuv_pair_to_rgb(y0: u8, y1: u8, u: u8, v: u8) -> [[u8; 3]; 2] {
    YUV_LUT.pair(y0, y1, u, v)
}

#[inline(always)]
fn rgb_f32<const C: usize>(p: [u8; 3]) -> [f32; C] {
    let mut v = [0.0f32; C];
    if C == 1 {
        v[0] = rgb_to_grey(u32::from(p[0]), u32::from(p[1]), u32::from(p[2])) as f32;
    } else {
        for (o, x) in v.iter_mut().zip(p) {
            *o = f32::from(x);
        }
    }
    v
}

#[cfg(test)]
#[inline(always)]
fn sat_u8(v: i32) -> u8 {
    v.clamp(0, 255) as u8
}

/// OpenCV 5.0's RGB -> grey weights in 15-bit fixed point (0.299, 0.587, 0.114 scaled by
/// 2^15, summing to 2^15). OpenCV 4.x used 14 bits (4899, 9617, 1868); 5.0 uses these
/// for u8 and u16 alike (found by experiment: exact for all 2^24 u8 triples and for
/// 10^6 random u16 triples).
pub(crate) const GREY_WEIGHTS: [u32; 3] = [9798, 19235, 3735];
/// Shift of [`GREY_WEIGHTS`].
pub(crate) const GREY_SHIFT: u32 = 15;

/// `cv2.cvtColor(rgb, COLOR_RGB2GRAY)` of one pixel, u8 or u16 samples:
/// `(9798*R + 19235*G + 3735*B + 2^14) >> 15` (fits u32 for u16 samples).
#[inline(always)]
pub(crate) fn rgb_to_grey(r: u32, g: u32, b: u32) -> u32 {
    (GREY_WEIGHTS[0] * r + GREY_WEIGHTS[1] * g + GREY_WEIGHTS[2] * b + (1 << (GREY_SHIFT - 1)))
        >> GREY_SHIFT
}

/// The grey value of a padding colour given as (possibly fractional) `[R, G, B]` source
/// units: the same weights as [`rgb_to_grey`] without the integer rounding, so
/// `[v, v, v]` gives exactly `v`.
pub(crate) fn pad_grey(rgb: [f64; 3]) -> f64 {
    let w = GREY_WEIGHTS.map(f64::from);
    (w[0] * rgb[0] + w[1] * rgb[1] + w[2] * rgb[2]) / f64::from(1u32 << GREY_SHIFT)
}

/// A 16-bit sample in 8-bit units: `v / 257.0` (65535 -> 255.0), correctly rounded f32.
#[inline(always)]
pub(crate) fn u16_units(v: u32) -> f32 {
    v as f32 / 257.0
}

// ---------------------------------------------------------------------------------
// Sources: one per encoding family, monomorphised so the hot loops have no `match`.
// ---------------------------------------------------------------------------------

/// A decodable source image. `row(y)` resolves everything that depends only on the row
/// (slices, row parity); `rgb`/`grey` decode one pixel of that row.
pub(crate) trait Source: Sync {
    /// Per-row context (borrowed slices and flags), cheap to copy.
    type Row<'a>: Copy
    where
        Self: 'a;
    /// The context of source row `y` (`y < height`).
    fn row(&self, y: usize) -> Self::Row<'_>;
    /// Pixel `x` of the row as `[R, G, B]` in 8-bit units (grey sources replicate).
    fn rgb(row: Self::Row<'_>, x: usize) -> [f32; 3];
    /// Pixel `x` of the row as grey in 8-bit units (colour sources: OpenCV's
    /// `COLOR_RGB2GRAY` on the decoded integer RGB, before any resampling).
    fn grey(row: Self::Row<'_>, x: usize) -> f32;
    /// Pixels `x0 .. x0 + n` of the row into `out`, planar: `C` planes of `n` values
    /// (`C` = 3: R, G, B; `C` = 1: grey). Same values as [`Source::rgb`] /
    /// [`Source::grey`]; encodings override it where neighbours share work.
    #[inline(always)]
    fn decode_row<const C: usize>(row: Self::Row<'_>, x0: usize, n: usize, out: &mut [f32]) {
        for i in 0..n {
            put::<C>(out, n, i, pixel::<Self, C>(row, x0 + i));
        }
    }
    /// A packed 8-bit RGB row ([`Packed8`]) as its bytes with `[bytes per pixel, R, G, B
    /// byte offsets]`, for the NEON tap decoder; `None` for every other source.
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn packed8<'r>(_row: Self::Row<'r>) -> Option<(&'r [u8], [usize; 4])>
    where
        Self: 'r,
    {
        None
    }
    /// Pixels `xs[i]` of the row into `out`, planar: `C` planes of `xs.len()` values.
    /// Same values as [`Source::rgb`] / [`Source::grey`]; encodings override it where a
    /// block of pixels converts faster than one at a time.
    #[inline(always)]
    fn decode_at<const C: usize>(row: Self::Row<'_>, xs: &[i32], out: &mut [f32]) {
        let n = xs.len();
        for (i, &x) in xs.iter().enumerate() {
            put::<C>(out, n, i, pixel::<Self, C>(row, x as usize));
        }
    }
}

/// Pixel `x` as `C` channels: `[grey]` or `[R, G, B]`.
#[inline(always)]
pub(crate) fn pixel<S: Source + ?Sized, const C: usize>(row: S::Row<'_>, x: usize) -> [f32; C] {
    let mut v = [0.0f32; C];
    if C == 1 {
        v[0] = S::grey(row, x);
    } else {
        v.copy_from_slice(&S::rgb(row, x)[..C]);
    }
    v
}

/// Write `v` at index `i` of the `C` planes of `n` values in `out`.
#[inline(always)]
fn put<const C: usize>(out: &mut [f32], n: usize, i: usize, v: [f32; C]) {
    for (k, val) in v.into_iter().enumerate() {
        out[k * n + i] = val;
    }
}

#[inline(always)]
fn row_of<'a>(img: &ImageView<'a>, y: usize) -> &'a [u8] {
    let step = img.step() as usize;
    &img.data()[y * step..(y + 1) * step]
}

/// The rows of a [`Source`] whose pixels all lie in one row of its image (`img`).
macro_rules! byte_rows {
    () => {
        type Row<'r>
            = &'r [u8]
        where
            Self: 'r;
        #[inline(always)]
        fn row(&self, y: usize) -> &[u8] {
            row_of(&self.img, y)
        }
    };
}

/// 8-bit packed RGB family: `rgb8` (BPP 3, R 0, G 1, B 2), `bgr8` (3, 2, 1, 0), `rgba8`
/// (4, 0, 1, 2), `bgra8` (4, 2, 1, 0). OpenCV: none / `COLOR_BGR2RGB` / `COLOR_RGBA2RGB` /
/// `COLOR_BGRA2RGB` (byte shuffles; alpha is ignored).
#[derive(Clone, Copy)]
pub(crate) struct Packed8<'a, const BPP: usize, const R: usize, const G: usize, const B: usize> {
    img: ImageView<'a>,
}

impl<'a, const BPP: usize, const R: usize, const G: usize, const B: usize>
    Packed8<'a, BPP, R, G, B>
{
    /// Wrap an image of the matching encoding.
    pub(crate) fn new(img: ImageView<'a>) -> Self {
        Packed8 { img }
    }
}

impl<const BPP: usize, const R: usize, const G: usize, const B: usize> Source
    for Packed8<'_, BPP, R, G, B>
{
    byte_rows!();
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn packed8<'r>(row: &'r [u8]) -> Option<(&'r [u8], [usize; 4])>
    where
        Self: 'r,
    {
        Some((row, [BPP, R, G, B]))
    }
    #[inline(always)]
    fn rgb(row: &[u8], x: usize) -> [f32; 3] {
        let p = &row[x * BPP..x * BPP + BPP];
        [f32::from(p[R]), f32::from(p[G]), f32::from(p[B])]
    }
    #[inline(always)]
    fn grey(row: &[u8], x: usize) -> f32 {
        let p = &row[x * BPP..x * BPP + BPP];
        rgb_to_grey(u32::from(p[R]), u32::from(p[G]), u32::from(p[B])) as f32
    }
}

/// `mono8`: one byte, replicated to R = G = B for colour output. OpenCV:
/// `COLOR_GRAY2RGB` (a copy).
#[derive(Clone, Copy)]
pub(crate) struct Mono8<'a> {
    img: ImageView<'a>,
}

impl<'a> Mono8<'a> {
    /// Wrap a `mono8` image.
    pub(crate) fn new(img: ImageView<'a>) -> Self {
        Mono8 { img }
    }
}

impl Source for Mono8<'_> {
    byte_rows!();
    #[inline(always)]
    fn rgb(row: &[u8], x: usize) -> [f32; 3] {
        let v = f32::from(row[x]);
        [v, v, v]
    }
    #[inline(always)]
    fn grey(row: &[u8], x: usize) -> f32 {
        f32::from(row[x])
    }
}

/// 16-bit samples: `mono16` (CH 1), `rgb16` (CH 3, R 0, G 1, B 2), `bgr16` (3, 2, 1, 0);
/// byte order from `is_bigendian` (`BE`). Each sample `v` becomes `v / 257.0` (f32, not
/// rounded), so one `pixel_scale` serves 8- and 16-bit sources. Grey output from colour:
/// `COLOR_RGB2GRAY` on the u16 samples (OpenCV's 15-bit fixed point, same weights as
/// u8), then `/ 257.0`.
#[derive(Clone, Copy)]
pub(crate) struct Packed16<
    'a,
    const CH: usize,
    const R: usize,
    const G: usize,
    const B: usize,
    const BE: bool,
> {
    img: ImageView<'a>,
}

impl<'a, const CH: usize, const R: usize, const G: usize, const B: usize, const BE: bool>
    Packed16<'a, CH, R, G, B, BE>
{
    /// Wrap an image of the matching encoding and byte order.
    pub(crate) fn new(img: ImageView<'a>) -> Self {
        Packed16 { img }
    }

    #[inline(always)]
    fn sample(row: &[u8], i: usize) -> u32 {
        let b = [row[2 * i], row[2 * i + 1]];
        u32::from(if BE { u16::from_be_bytes(b) } else { u16::from_le_bytes(b) })
    }
}

impl<const CH: usize, const R: usize, const G: usize, const B: usize, const BE: bool> Source
    for Packed16<'_, CH, R, G, B, BE>
{
    byte_rows!();
    #[inline(always)]
    fn rgb(row: &[u8], x: usize) -> [f32; 3] {
        if CH == 1 {
            let v = u16_units(Self::sample(row, x));
            [v, v, v]
        } else {
            let i = x * CH;
            [
                u16_units(Self::sample(row, i + R)),
                u16_units(Self::sample(row, i + G)),
                u16_units(Self::sample(row, i + B)),
            ]
        }
    }
    #[inline(always)]
    fn grey(row: &[u8], x: usize) -> f32 {
        if CH == 1 {
            u16_units(Self::sample(row, x))
        } else {
            let i = x * CH;
            u16_units(rgb_to_grey(
                Self::sample(row, i + R),
                Self::sample(row, i + G),
                Self::sample(row, i + B),
            ))
        }
    }
}

/// YUV 4:2:2, two pixels in four bytes. `yuyv` (= `yuv422_yuy2`): bytes `Y0 U Y1 V`
/// (Y 0, U 1, V 3), OpenCV `COLOR_YUV2RGB_YUY2`; `uyvy` (= `yuv422`): bytes `U Y0 V Y1`
/// (Y 1, U 0, V 2), OpenCV `COLOR_YUV2RGB_UYVY`. Pixel `x` takes luma `Y(x&1)` of its
/// pair `x/2` and the pair's U, V, then [`yuv_to_rgb`].
#[derive(Clone, Copy)]
pub(crate) struct Yuv422<'a, const Y: usize, const U: usize, const V: usize> {
    img: ImageView<'a>,
}

impl<'a, const Y: usize, const U: usize, const V: usize> Yuv422<'a, Y, U, V> {
    /// Wrap an image of the matching encoding.
    pub(crate) fn new(img: ImageView<'a>) -> Self {
        Yuv422 { img }
    }
}

impl<const Y: usize, const U: usize, const V: usize> Source for Yuv422<'_, Y, U, V> {
    byte_rows!();
    #[inline(always)]
    fn rgb(row: &[u8], x: usize) -> [f32; 3] {
        rgb_f32(yuv422_rgb::<Y, U, V>(row, x))
    }
    #[inline(always)]
    fn grey(row: &[u8], x: usize) -> f32 {
        rgb_f32::<1>(yuv422_rgb::<Y, U, V>(row, x))[0]
    }
    #[inline(always)]
    fn decode_row<const C: usize>(row: &[u8], x0: usize, n: usize, out: &mut [f32]) {
        // Gather Y, U, V bytes of a block of pixels, then convert the block in one
        // straight loop the compiler vectorizes.
        let mut done = 0;
        while done < n {
            let m = (n - done).min(YUV_BLOCK);
            let (mut ys, mut us, mut vs) = ([0u8; YUV_BLOCK], [0u8; YUV_BLOCK], [0u8; YUV_BLOCK]);
            let x = x0 + done;
            // An odd first pixel, then whole pairs, then an odd last pixel.
            let mut i = 0;
            if x & 1 == 1 {
                let pair = &row[(x >> 1) * 4..(x >> 1) * 4 + 4];
                (ys[0], us[0], vs[0]) = (pair[Y + 2], pair[U], pair[V]);
                i = 1;
            }
            let pairs = (m - i) / 2;
            let start = ((x + i) >> 1) * 4;
            for (j, q) in row[start..start + 4 * pairs].chunks_exact(4).enumerate() {
                let k = i + 2 * j;
                (ys[k], ys[k + 1]) = (q[Y], q[Y + 2]);
                (us[k], us[k + 1]) = (q[U], q[U]);
                (vs[k], vs[k + 1]) = (q[V], q[V]);
            }
            i += 2 * pairs;
            if i < m {
                let xe = x + i;
                let pair = &row[(xe >> 1) * 4..(xe >> 1) * 4 + 4];
                (ys[i], us[i], vs[i]) = (pair[Y], pair[U], pair[V]);
            }
            yuv_block::<C>(&ys[..m], &us[..m], &vs[..m], out, n, done);
            done += m;
        }
    }
    #[inline(always)]
    fn decode_at<const C: usize>(row: &[u8], xs: &[i32], out: &mut [f32]) {
        yuv_decode_at::<C>(xs, out, |x| {
            let pair = &row[(x >> 1) * 4..(x >> 1) * 4 + 4];
            (pair[Y + 2 * (x & 1)], pair[U], pair[V])
        });
    }
}

/// [`Source::decode_at`] for YUV encodings: gather the Y, U, V bytes of a block of
/// pixels with `yuv(x)`, then convert the block with [`yuv_block`].
#[inline(always)]
fn yuv_decode_at<const C: usize>(xs: &[i32], out: &mut [f32], yuv: impl Fn(usize) -> (u8, u8, u8)) {
    let n = xs.len();
    for (b, block) in xs.chunks(YUV_BLOCK).enumerate() {
        let (mut ys, mut us, mut vs) = ([0u8; YUV_BLOCK], [0u8; YUV_BLOCK], [0u8; YUV_BLOCK]);
        for (i, &x) in block.iter().enumerate() {
            (ys[i], us[i], vs[i]) = yuv(x as usize);
        }
        let m = block.len();
        yuv_block::<C>(&ys[..m], &us[..m], &vs[..m], out, n, b * YUV_BLOCK);
    }
}

/// Pixels converted per block by [`yuv_block`].
const YUV_BLOCK: usize = 64;

/// [`yuv_to_rgb`] of `ys.len()` pixels (Y, U, V bytes each) into the `C` planes of `n`
/// values of `out`, at `off..off + ys.len()`; grey (`C` = 1) as [`rgb_to_grey`]. The
/// same integer arithmetic, written as one loop over arrays so it vectorizes.
#[inline(always)]
fn yuv_block<const C: usize>(
    ys: &[u8],
    us: &[u8],
    vs: &[u8],
    out: &mut [f32],
    n: usize,
    off: usize,
) {
    use bt601::*;
    let m = ys.len();
    let (us, vs) = (&us[..m], &vs[..m]);
    let half = 1 << (SHIFT - 1);
    let conv = |i: usize| {
        let uu = i32::from(us[i]) - 128;
        let vv = i32::from(vs[i]) - 128;
        let yy = (i32::from(ys[i]) - 16).max(0) * CY + half;
        let r = ((yy + CVR * vv) >> SHIFT).clamp(0, 255);
        let g = ((yy + CVG * vv + CUG * uu) >> SHIFT).clamp(0, 255);
        let b = ((yy + CUB * uu) >> SHIFT).clamp(0, 255);
        (r, g, b)
    };
    if C == 1 {
        let dst = &mut out[off..off + m];
        for (i, d) in dst.iter_mut().enumerate() {
            let (r, g, b) = conv(i);
            let w = GREY_WEIGHTS.map(|w| w as i32);
            *d = ((w[0] * r + w[1] * g + w[2] * b + (1 << (GREY_SHIFT - 1))) >> GREY_SHIFT) as f32;
        }
    } else {
        let (rp, rest) = out.split_at_mut(n);
        let (gp, bp) = rest.split_at_mut(n);
        let (rp, gp, bp) = (&mut rp[off..off + m], &mut gp[off..off + m], &mut bp[off..off + m]);
        for i in 0..m {
            let (r, g, b) = conv(i);
            rp[i] = r as f32;
            gp[i] = g as f32;
            bp[i] = b as f32;
        }
    }
}

#[inline(always)]
fn yuv422_rgb<const Y: usize, const U: usize, const V: usize>(row: &[u8], x: usize) -> [u8; 3] {
    let pair = &row[(x >> 1) * 4..(x >> 1) * 4 + 4];
    YUV_LUT.rgb(pair[Y + 2 * (x & 1)], pair[U], pair[V])
}

/// YUV 4:2:0 semi-planar: `height` rows of Y, then `height/2` rows of interleaved chroma,
/// all with stride `step`. `nv12`: chroma `U V` (U 0, V 1), OpenCV `COLOR_YUV2RGB_NV12`;
/// `nv21`: `V U` (U 1, V 0), OpenCV `COLOR_YUV2RGB_NV21`. Pixel (x, y) takes `Y[y][x]`
/// and the chroma pair at row `height + y/2`, bytes `2*(x/2)`, `2*(x/2)+1`, then
/// [`yuv_to_rgb`].
#[derive(Clone, Copy)]
pub(crate) struct Nv<'a, const U: usize, const V: usize> {
    img: ImageView<'a>,
}

impl<'a, const U: usize, const V: usize> Nv<'a, U, V> {
    /// Wrap an image of the matching encoding.
    pub(crate) fn new(img: ImageView<'a>) -> Self {
        Nv { img }
    }
}

impl<const U: usize, const V: usize> Source for Nv<'_, U, V> {
    type Row<'r>
        = (&'r [u8], &'r [u8])
    where
        Self: 'r;
    #[inline(always)]
    fn row(&self, y: usize) -> (&[u8], &[u8]) {
        let h = self.img.height() as usize;
        (row_of(&self.img, y), row_of(&self.img, h + y / 2))
    }
    #[inline(always)]
    fn rgb(row: (&[u8], &[u8]), x: usize) -> [f32; 3] {
        rgb_f32(nv_rgb::<U, V>(row, x))
    }
    #[inline(always)]
    fn grey(row: (&[u8], &[u8]), x: usize) -> f32 {
        rgb_f32::<1>(nv_rgb::<U, V>(row, x))[0]
    }
    #[inline(always)]
    fn decode_row<const C: usize>(row: (&[u8], &[u8]), x0: usize, n: usize, out: &mut [f32]) {
        let mut i = 0;
        if x0 & 1 == 1 && n > 0 {
            put::<C>(out, n, 0, pixel::<Self, C>(row, x0));
            i = 1;
        }
        let pairs = (n - i) / 2;
        let start = x0 + i;
        let (luma, chroma) = row;
        let ys = luma[start..start + 2 * pairs].chunks_exact(2);
        let cs = chroma[start..start + 2 * pairs].chunks_exact(2);
        for (j, (yq, cq)) in ys.zip(cs).enumerate() {
            let [a, b] = yuv_pair_to_rgb(yq[0], yq[1], cq[U], cq[V]);
            put::<C>(out, n, i + 2 * j, rgb_f32::<C>(a));
            put::<C>(out, n, i + 2 * j + 1, rgb_f32::<C>(b));
        }
        i += 2 * pairs;
        if i < n {
            put::<C>(out, n, i, pixel::<Self, C>(row, x0 + i));
        }
    }
    #[inline(always)]
    fn decode_at<const C: usize>((luma, chroma): (&[u8], &[u8]), xs: &[i32], out: &mut [f32]) {
        yuv_decode_at::<C>(xs, out, |x| {
            let c = &chroma[x & !1..(x & !1) + 2];
            (luma[x], c[U], c[V])
        });
    }
}

#[inline(always)]
fn nv_rgb<const U: usize, const V: usize>((luma, chroma): (&[u8], &[u8]), x: usize) -> [u8; 3] {
    let c = &chroma[x & !1..(x & !1) + 2];
    YUV_LUT.rgb(luma[x], c[U], c[V])
}

/// 8-bit Bayer mosaic, bilinear demosaicing exactly as OpenCV's `Bayer2RGB_`
/// (`modules/imgproc/src/demosaicing.cpp`). `RED` is the position of red in the 2x2
/// tile, `(y & 1) * 2 + (x & 1)`; blue is at `3 - RED`; green at the other two.
///
/// | encoding      | tile    | `RED` | OpenCV 5.0 code (alias, value)                 |
/// |---------------|---------|-------|------------------------------------------------|
/// | `bayer_rggb8` | R G/G B | 0     | `COLOR_BayerRGGB2RGB` (`COLOR_BayerBG2RGB`, 48) |
/// | `bayer_grbg8` | G R/B G | 1     | `COLOR_BayerGRBG2RGB` (`COLOR_BayerGB2RGB`, 49) |
/// | `bayer_gbrg8` | G B/R G | 2     | `COLOR_BayerGBRG2RGB` (`COLOR_BayerGR2RGB`, 47) |
/// | `bayer_bggr8` | B G/G R | 3     | `COLOR_BayerBGGR2RGB` (`COLOR_BayerRG2RGB`, 46) |
///
/// (OpenCV's two-letter names give the colours of the second row's 2nd and 3rd pixel,
/// hence the shift; OpenCV 5 adds the four-letter aliases. Checked by experiment.)
///
/// Interior pixel (1 <= x <= w-2, 1 <= y <= h-2), with `c` its own value, `cross` the
/// sum of its 4 edge neighbours and `diag` the sum of its 4 corner neighbours:
/// - red or blue pixel: own channel `c`; green `(cross + 2) >> 2`; the other colour
///   `(diag + 2) >> 2`;
/// - green pixel: green `c`; the colour of its left/right neighbours
///   `(left + right + 1) >> 1`; the colour of its up/down neighbours `(up + down + 1) >> 1`.
///
/// Borders: column 0 copies column 1 and column w-1 copies w-2, then row 0 copies row 1
/// and row h-1 copies h-2; so pixel (x, y) is the interior pixel
/// (clamp(x, 1, w-2), clamp(y, 1, h-2)). Images with w <= 2 or h <= 2 decode to all 0.
#[derive(Clone, Copy)]
pub(crate) struct Bayer<'a, const RED: usize> {
    img: ImageView<'a>,
}

impl<'a, const RED: usize> Bayer<'a, RED> {
    /// Wrap an image of the matching pattern.
    pub(crate) fn new(img: ImageView<'a>) -> Self {
        Bayer { img }
    }
}

/// The three source rows around a (clamped) Bayer row.
#[derive(Clone, Copy)]
pub(crate) struct BayerRow<'a> {
    up: &'a [u8],
    mid: &'a [u8],
    down: &'a [u8],
    /// `(y & 1) * 2` of the clamped row.
    parity: usize,
    /// Image width.
    width: usize,
    /// w <= 2 or h <= 2: every pixel is 0.
    zero: bool,
}

impl<const RED: usize> Source for Bayer<'_, RED> {
    type Row<'r>
        = BayerRow<'r>
    where
        Self: 'r;
    #[inline(always)]
    fn row(&self, y: usize) -> BayerRow<'_> {
        let (w, h) = (self.img.width() as usize, self.img.height() as usize);
        if w <= 2 || h <= 2 {
            let r = row_of(&self.img, 0);
            return BayerRow { up: r, mid: r, down: r, parity: 0, width: w, zero: true };
        }
        let y = y.clamp(1, h - 2);
        BayerRow {
            up: row_of(&self.img, y - 1),
            mid: row_of(&self.img, y),
            down: row_of(&self.img, y + 1),
            parity: (y & 1) * 2,
            width: w,
            zero: false,
        }
    }
    #[inline(always)]
    fn rgb(row: BayerRow<'_>, x: usize) -> [f32; 3] {
        rgb_f32(bayer_rgb::<RED>(row, x))
    }
    #[inline(always)]
    fn grey(row: BayerRow<'_>, x: usize) -> f32 {
        rgb_f32::<1>(bayer_rgb::<RED>(row, x))[0]
    }
}

#[inline(always)]
fn bayer_rgb<const RED: usize>(row: BayerRow<'_>, x: usize) -> [u8; 3] {
    if row.zero {
        return [0, 0, 0];
    }
    let x = x.clamp(1, row.width - 2);
    let (up, mid, down) = (&row.up[x - 1..x + 2], &row.mid[x - 1..x + 2], &row.down[x - 1..x + 2]);
    let v = |s: &[u8], i: usize| u32::from(s[i]);
    let c = mid[1];
    let pos = row.parity + (x & 1);
    if pos == RED || pos == 3 - RED {
        let cross = ((v(mid, 0) + v(mid, 2) + v(up, 1) + v(down, 1) + 2) >> 2) as u8;
        let diag = ((v(up, 0) + v(up, 2) + v(down, 0) + v(down, 2) + 2) >> 2) as u8;
        if pos == RED {
            [c, cross, diag]
        } else {
            [diag, cross, c]
        }
    } else {
        let horiz = ((v(mid, 0) + v(mid, 2) + 1) >> 1) as u8;
        let vert = ((v(up, 1) + v(down, 1) + 1) >> 1) as u8;
        // The left/right neighbours sit at position pos ^ 1.
        if pos ^ 1 == RED {
            [horiz, c, vert]
        } else {
            [vert, c, horiz]
        }
    }
}

/// Call `$body` with `$s` bound to the [`Source`] of `$img`'s encoding (and byte order):
/// the one `match` on the encoding, outside every loop.
macro_rules! with_source {
    ($img:expr, $s:ident => $body:expr) => {{
        use $crate::backend::cpu::decode::*;
        use $crate::image::Encoding as E;
        let img = $img;
        let be = img.big_endian();
        // Bind `$s` to the Source type of one arm and run `$body`.
        macro_rules! arm {
            ($source:ty) => {{
                let $s = <$source>::new(img);
                $body
            }};
        }
        match img.encoding() {
            E::Rgb8 => arm!(Packed8::<3, 0, 1, 2>),
            E::Bgr8 => arm!(Packed8::<3, 2, 1, 0>),
            E::Rgba8 => arm!(Packed8::<4, 0, 1, 2>),
            E::Bgra8 => arm!(Packed8::<4, 2, 1, 0>),
            E::Mono8 => arm!(Mono8),
            E::Mono16 if be => arm!(Packed16::<1, 0, 0, 0, true>),
            E::Mono16 => arm!(Packed16::<1, 0, 0, 0, false>),
            E::Rgb16 if be => arm!(Packed16::<3, 0, 1, 2, true>),
            E::Rgb16 => arm!(Packed16::<3, 0, 1, 2, false>),
            E::Bgr16 if be => arm!(Packed16::<3, 2, 1, 0, true>),
            E::Bgr16 => arm!(Packed16::<3, 2, 1, 0, false>),
            E::Yuyv => arm!(Yuv422::<0, 1, 3>),
            E::Uyvy => arm!(Yuv422::<1, 0, 2>),
            E::Nv12 => arm!(Nv::<0, 1>),
            E::Nv21 => arm!(Nv::<1, 0>),
            E::BayerRggb8 => arm!(Bayer::<0>),
            E::BayerGrbg8 => arm!(Bayer::<1>),
            E::BayerGbrg8 => arm!(Bayer::<2>),
            E::BayerBggr8 => arm!(Bayer::<3>),
        }
    }};
}
pub(crate) use with_source;

/// Decode pixel (x, y) of `img` to `[R, G, B]` in 8-bit units (per-pixel dispatch: for
/// tests, tools and the reference pass, not for hot loops).
pub(crate) fn pixel_rgb(img: &ImageView<'_>, x: usize, y: usize) -> [f32; 3] {
    fn go<S: Source>(s: &S, x: usize, y: usize) -> [f32; 3] {
        S::rgb(s.row(y), x)
    }
    with_source!(*img, s => go(&s, x, y))
}

/// Decode pixel (x, y) of `img` to grey in 8-bit units (see [`Source::grey`]).
pub(crate) fn pixel_grey(img: &ImageView<'_>, x: usize, y: usize) -> f32 {
    fn go<S: Source>(s: &S, x: usize, y: usize) -> f32 {
        S::grey(s.row(y), x)
    }
    with_source!(*img, s => go(&s, x, y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yuv_golden_values() {
        // Hand arithmetic with OpenCV's constants:
        // y=16, u=v=128: yy=0, ruv=guv=buv=2^19 -> 2^19>>20 = 0 -> black.
        assert_eq!(yuv_to_rgb(16, 128, 128), [0, 0, 0]);
        // y=235: yy=219*1220542=267298698; +2^19=267822986; >>20 = 255 (255.41).
        assert_eq!(yuv_to_rgb(235, 128, 128), [255, 255, 255]);
        // cv2.cvtColor(np.array([[128, 64, 128, 200]], np.uint8).reshape(1, 2, 2),
        //              cv2.COLOR_YUV2RGB_YUY2)[0, 0] -> [245, 97, 1]
        // yy = 112*1220542 = 136700704, uu = -64, vv = 72:
        // R = (136700704 + 524288 + 1673527*72) >> 20 = 257718936 >> 20 = 245
        // G = (136700704 + 524288 - 852492*72 - 409993*-64) >> 20 = 102085120 >> 20 = 97
        // B = (136700704 + 524288 + 2116026*-64) >> 20 = 1799328 >> 20 = 1
        assert_eq!(yuv_to_rgb(128, 64, 200), [245, 97, 1]);
        // y < 16 clamps luma to 0; saturation at both ends. cv2 (YUY2 bytes 0,255,0,0)
        // -> [0, 54, 255]: R = (2^19 - 1673527*128) >> 20 < 0 -> 0;
        // G = (2^19 + 852492*128 - 409993*127) >> 20 = 54; B = (2^19 + 2116026*127) >> 20
        // = 256 -> 255.
        assert_eq!(yuv_to_rgb(0, 255, 0), [0, 54, 255]);
    }

    #[test]
    fn yuv_tables_equal_the_formula_for_all_inputs() {
        for y in 0..=255u8 {
            for u in 0..=255u8 {
                for v in 0..=255u8 {
                    let f = yuv_to_rgb(y, u, v);
                    assert_eq!(YUV_LUT.rgb(y, u, v), f, "y {y} u {u} v {v}");
                    assert_eq!(yuv_pair_to_rgb(y, 255 - y, u, v)[0], f);
                }
            }
        }
    }

    #[test]
    fn grey_golden_values() {
        // cv2.cvtColor(np.array([[[255,0,0],[0,255,0],[0,0,255],[10,200,30]]],np.uint8),
        //              cv2.COLOR_RGB2GRAY) -> [[76, 150, 29, 121]] (OpenCV 5.0)
        // 255*9798 = 2498490 + 16384 = 2514874 >> 15 = 76.7 -> 76
        assert_eq!(rgb_to_grey(255, 0, 0), 76);
        // 255*19235 = 4904925 + 16384 >> 15 = 150.2 -> 150
        assert_eq!(rgb_to_grey(0, 255, 0), 150);
        // 255*3735 = 952425 + 16384 >> 15 = 29.6 -> 29
        assert_eq!(rgb_to_grey(0, 0, 255), 29);
        // 10*9798 + 200*19235 + 30*3735 = 4057030; + 16384 >> 15 = 124.3 -> 124
        assert_eq!(rgb_to_grey(10, 200, 30), 124);
        // Weights sum to 2^15: grey of (v, v, v) is v, u8 and u16.
        assert_eq!(rgb_to_grey(77, 77, 77), 77);
        assert_eq!(rgb_to_grey(65535, 65535, 65535), 65535);
        assert_eq!(pad_grey([114.0, 114.0, 114.0]), 114.0);
        assert_eq!(pad_grey([0.5, 0.5, 0.5]), 0.5);
    }

    #[test]
    fn sixteen_bit_units() {
        assert_eq!(u16_units(65535), 255.0);
        assert_eq!(u16_units(257), 1.0);
        assert_eq!(u16_units(128), 128.0f32 / 257.0);
    }

    fn bayer_img<'a>(w: u32, h: u32, enc: &str, data: &'a [u8]) -> ImageView<'a> {
        ImageView::new(w, h, w, enc, false, data).unwrap()
    }

    #[test]
    fn bayer_golden_4x4() {
        // RGGB mosaic, values v(x, y) = 10 * y + x + 1 (rows 1..4, 11..14, 21..24, 31..34):
        // cv2.cvtColor(np.array([[1,2,3,4],[11,12,13,14],[21,22,23,24],[31,32,33,34]],
        //   np.uint8), cv2.COLOR_BayerRGGB2RGB)[1, 1] -> [12, 12, 12]
        // pixel (1,1) is B=12; G = (2 + 22 + 11 + 13 + 2) >> 2 = 12; R = (1+3+21+23+2)>>2 = 12
        let d: Vec<u8> = (0..4).flat_map(|y| (0..4).map(move |x| 10 * y + x + 1)).collect();
        let img = bayer_img(4, 4, "bayer_rggb8", &d);
        assert_eq!(pixel_rgb(&img, 1, 1), [12.0, 12.0, 12.0]);
        // (2,1) is green in a G B row: horiz (B) = (12 + 14 + 1) >> 1 = 13,
        // vert (R) = (3 + 23 + 1) >> 1 = 13, G = 13.
        assert_eq!(pixel_rgb(&img, 2, 1), [13.0, 13.0, 13.0]);
        // Corner (0,0) copies (1,1); (3,3) copies (2,2).
        assert_eq!(pixel_rgb(&img, 0, 0), pixel_rgb(&img, 1, 1));
        assert_eq!(pixel_rgb(&img, 3, 3), pixel_rgb(&img, 2, 2));
    }

    #[test]
    fn bayer_patterns_put_colours_where_they_belong() {
        // A 4x4 tile of a pure-red scene in each pattern: red samples 200, others 0.
        // Pixel (1,1) of RGGB is blue: R = diag avg = (200*4 + 2) >> 2 = 200, G = 0, B = 0.
        for (enc, red) in
            [("bayer_rggb8", 0), ("bayer_grbg8", 1), ("bayer_gbrg8", 2), ("bayer_bggr8", 3)]
        {
            let d: Vec<u8> = (0..16)
                .map(|i| {
                    let (x, y) = (i % 4, i / 4);
                    if (y & 1) * 2 + (x & 1) == red {
                        200
                    } else {
                        0
                    }
                })
                .collect();
            let img = bayer_img(4, 4, enc, &d);
            for (x, y) in [(1, 1), (2, 1), (1, 2), (2, 2)] {
                let p = pixel_rgb(&img, x, y);
                assert_eq!(p, [200.0, 0.0, 0.0], "{enc} at ({x},{y})");
            }
        }
    }

    #[test]
    fn bayer_too_small_is_black() {
        // cv2.cvtColor(np.full((2, 5), 200, np.uint8), cv2.COLOR_BayerRGGB2RGB) -> all 0
        let d = vec![200u8; 10];
        let img = bayer_img(5, 2, "bayer_rggb8", &d);
        assert_eq!(pixel_rgb(&img, 2, 1), [0.0; 3]);
        let img = bayer_img(2, 5, "bayer_rggb8", &d);
        assert_eq!(pixel_rgb(&img, 1, 2), [0.0; 3]);
    }

    #[test]
    fn packed_and_16bit_decode() {
        let d = [1u8, 2, 3, 4, 5, 6];
        let img = ImageView::new(2, 1, 6, "bgr8", false, &d).unwrap();
        assert_eq!(pixel_rgb(&img, 1, 0), [6.0, 5.0, 4.0]);
        // 0x0101 = 257 -> 1.0 (both byte orders read the same here); 0x0201:
        // little endian 0x0102 = 258 -> 258/257, big endian 0x0201 = 513 -> 513/257.
        let d = [1u8, 2];
        let le = ImageView::new(1, 1, 2, "mono16", false, &d).unwrap();
        let be = ImageView::new(1, 1, 2, "mono16", true, &d).unwrap();
        assert_eq!(pixel_grey(&le, 0, 0), 513.0f32 / 257.0);
        assert_eq!(pixel_grey(&be, 0, 0), 258.0f32 / 257.0);
        // rgb16 grey: R=65535 only -> (9798*65535 + 16384) >> 15 = 19596 -> 19596/257.
        let d = [0xff, 0xff, 0, 0, 0, 0];
        let img = ImageView::new(1, 1, 6, "rgb16", false, &d).unwrap();
        assert_eq!(pixel_grey(&img, 0, 0), 19596.0f32 / 257.0);
        assert_eq!(pixel_rgb(&img, 0, 0), [255.0, 0.0, 0.0]);
    }

    #[test]
    fn yuyv_uyvy_and_nv_pick_the_right_bytes() {
        // One pair, Y0=81 Y1=145 U=90 V=240 (BT.601 of pure red is about Y 81 U 90 V 240).
        let yuyv = [81u8, 90, 145, 240];
        let uyvy = [90u8, 81, 240, 145];
        let a = ImageView::new(2, 1, 4, "yuyv", false, &yuyv).unwrap();
        let b = ImageView::new(2, 1, 4, "uyvy", false, &uyvy).unwrap();
        for x in 0..2 {
            assert_eq!(pixel_rgb(&a, x, 0), pixel_rgb(&b, x, 0));
        }
        let [r, g, b0] = yuv_to_rgb(81, 90, 240);
        assert_eq!(pixel_rgb(&a, 0, 0), [f32::from(r), f32::from(g), f32::from(b0)]);
        // cv2.cvtColor(np.array([[81, 90, 145, 240]], np.uint8).reshape(1, 2, 2),
        //              cv2.COLOR_YUV2RGB_YUY2) -> [[254, 0, 0], [255, 74, 73]]
        assert_eq!([r, g, b0], [254, 0, 0]);
        assert_eq!(pixel_rgb(&a, 1, 0), [255.0, 74.0, 73.0]);
        // NV12 2x2: Y plane then one chroma row U V; NV21 swaps them.
        let nv12 = [81u8, 145, 81, 145, 90, 240];
        let nv21 = [81u8, 145, 81, 145, 240, 90];
        let a = ImageView::new(2, 2, 2, "nv12", false, &nv12).unwrap();
        let b = ImageView::new(2, 2, 2, "nv21", false, &nv21).unwrap();
        assert_eq!(pixel_rgb(&a, 0, 1), [254.0, 0.0, 0.0]);
        assert_eq!(pixel_rgb(&a, 1, 1), pixel_rgb(&b, 1, 1));
        assert_eq!(pixel_rgb(&a, 1, 0), {
            let [r, g, b] = yuv_to_rgb(145, 90, 240);
            [f32::from(r), f32::from(g), f32::from(b)]
        });
    }
}
