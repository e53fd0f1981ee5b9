//! The NEON build of the band loop's inner loops (aarch64, little-endian), chosen at run
//! time by `Simd::Neon` as AVX2 is on x86-64.
//!
//! Each function computes what its portable twin (`Portable` in `mod.rs`) computes, with
//! the same IEEE f32 operations in the same order: a separate multiply and add (`fmul`,
//! `fadd`: never `fmla`, which would round once instead of twice), conversions of
//! integers below 2^24 (exact), the integer grey formula, and the f32 -> f16 conversion
//! of the hardware (`fcvtn`, round to nearest even with the Linux default FPCR, as
//! `half::f16::from_f32`). So the bits are the same; `test/cpu_spec.rs` checks every
//! encoding and mode against the per-element definition, under qemu.
//!
//! What is vectorized, 4 or 8 values per instruction: the horizontal and vertical blends
//! with the normalization, the NHWC interleave of three planes (`st3`), the f16 store
//! (straight into the output bytes), and the taps of packed 8-bit sources (rgb8, bgr8,
//! rgba8, bgra8: one `ld3`/`ld4` lane load per pixel, widened and converted 8 at a time).
//! Tails shorter than a vector run the portable loops.
//!
//! The loops are `#[target_feature(enable = "neon")]` functions, called only through
//! [`Neon`], which `band_dispatch` uses only when `Simd::detect` found NEON (every aarch64
//! CPU has it: it is part of the architecture's baseline).

use super::decode::{Source, GREY_SHIFT, GREY_WEIGHTS};
use super::{Loops, Portable, PreprocessParams, Store};
use std::arch::aarch64::*;
use std::arch::asm;

/// The NEON inner loops (used only when `Simd::detect` found NEON).
pub(super) struct Neon;

impl Loops for Neon {
    #[inline(always)]
    fn hblend(out: &mut [f32], a: &[f32], b: &[f32], w: &[f32]) {
        // SAFETY: `Neon` runs only where `Simd::detect` found NEON (`band_dispatch`).
        unsafe { hblend(out, a, b, w) }
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
        // The columns of output channel c's source plane in `h0`, `h1`.
        let plane = |c: usize| src_plane[c] * cw..(src_plane[c] + 1) * cw;
        if nhwc && C == 3 {
            let dst = &mut row[cx * 3..(cx + cw) * 3];
            let t = [0, 1, 2].map(|c| &h0[plane(c)]);
            let u = [0, 1, 2].map(|c| &h1[plane(c)]);
            // SAFETY: `Neon` runs only where `Simd::detect` found NEON (`band_dispatch`).
            unsafe { vblend3(dst, t, u, two, wy, p.scale, p.bias) }
        } else {
            // NCHW, or NHWC with one channel: each channel is a contiguous run.
            for c in 0..C {
                let dst = &mut row[c * w + cx..c * w + cx + cw];
                let (t, u) = (&h0[plane(c)], &h1[plane(c)]);
                // SAFETY: as above: NEON was detected.
                unsafe { vblend(dst, t, u, two, wy, p.scale[c], p.bias[c]) }
            }
        }
    }

    #[inline(always)]
    fn emit(vals: &[f32], dst: &mut [u8], store: Store, half_buf: &mut Vec<half::f16>) {
        match store {
            // Little-endian target: the f32 bytes are the tensor's bytes.
            Store::F32Le | Store::F32Native => {
                let n = vals.len().min(dst.len() / 4);
                dst[..4 * n].copy_from_slice(bytemuck::cast_slice(&vals[..n]));
            }
            Store::F16Le => {
                // SAFETY: as in `hblend`: NEON was detected.
                let v = unsafe { store_f16(vals, dst) };
                let n = vals.len().min(dst.len() / 2);
                super::emit(&vals[v..n], &mut dst[2 * v..2 * n], store, half_buf);
            }
        }
    }

    #[inline(always)]
    fn decode_at<S: Source, const C: usize>(row: S::Row<'_>, xs: &[i32], out: &mut [f32]) {
        let done = match S::packed8(row) {
            // SAFETY: as in `hblend`: NEON was detected.
            Some((bytes, [3, r, g, b])) => unsafe { packed8_at::<3, C>(bytes, [r, g, b], xs, out) },
            // SAFETY: as in `hblend`: NEON was detected.
            Some((bytes, [4, r, g, b])) => unsafe { packed8_at::<4, C>(bytes, [r, g, b], xs, out) },
            _ => false,
        };
        if !done {
            S::decode_at::<C>(row, xs, out);
        }
    }
}

/// [`Loops::hblend`].
#[target_feature(enable = "neon")]
#[inline]
unsafe fn hblend(out: &mut [f32], a: &[f32], b: &[f32], w: &[f32]) {
    let n = out.len().min(a.len()).min(b.len()).min(w.len());
    let v = n / 4 * 4;
    let one = vdupq_n_f32(1.0);
    let chunks = out[..v].chunks_exact_mut(4).zip(a[..v].chunks_exact(4));
    for ((o, a), (b, w)) in chunks.zip(b[..v].chunks_exact(4).zip(w[..v].chunks_exact(4))) {
        // SAFETY: every chunk holds exactly 4 f32 (`chunks_exact`), what one 128-bit load
        // or store reads or writes.
        unsafe {
            let (a, b, w) = (vld1q_f32(a.as_ptr()), vld1q_f32(b.as_ptr()), vld1q_f32(w.as_ptr()));
            vst1q_f32(o.as_mut_ptr(), vaddq_f32(vmulq_f32(a, vsubq_f32(one, w)), vmulq_f32(b, w)));
        }
    }
    Portable::hblend(&mut out[v..n], &a[v..n], &b[v..n], &w[v..n]);
}

/// One vector of [`vblend`]: `(t * iw + u * wy) * s + b`, or `t * s + b`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn vblend4(
    t: float32x4_t,
    u: float32x4_t,
    two: bool,
    (iw, wy): (float32x4_t, float32x4_t),
    s: float32x4_t,
    b: float32x4_t,
) -> float32x4_t {
    let m = if two { vaddq_f32(vmulq_f32(t, iw), vmulq_f32(u, wy)) } else { t };
    vaddq_f32(vmulq_f32(m, s), b)
}

/// The vertical blend and normalization of one contiguous plane:
/// `dst[i] = (t[i] * (1 - wy) + u[i] * wy) * scale + bias`, or `t[i] * scale + bias`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn vblend(dst: &mut [f32], t: &[f32], u: &[f32], two: bool, wy: f32, scale: f32, bias: f32) {
    // Without `two`, `u` is not read: `t` stands in for it.
    let u = if two { u } else { t };
    let n = dst.len().min(t.len()).min(u.len());
    let v = n / 4 * 4;
    let (s, b) = (vdupq_n_f32(scale), vdupq_n_f32(bias));
    let w = (vdupq_n_f32(1.0 - wy), vdupq_n_f32(wy));
    // Two loops, so that neither tests `two` per vector.
    if two {
        let chunks = dst[..v].chunks_exact_mut(4).zip(t[..v].chunks_exact(4));
        for ((d, t), u) in chunks.zip(u[..v].chunks_exact(4)) {
            // SAFETY: every chunk holds exactly 4 f32 (`chunks_exact`).
            unsafe {
                let r = vblend4(vld1q_f32(t.as_ptr()), vld1q_f32(u.as_ptr()), true, w, s, b);
                vst1q_f32(d.as_mut_ptr(), r);
            }
        }
    } else {
        for (d, t) in dst[..v].chunks_exact_mut(4).zip(t[..v].chunks_exact(4)) {
            // SAFETY: every chunk holds exactly 4 f32 (`chunks_exact`).
            unsafe {
                let t = vld1q_f32(t.as_ptr());
                vst1q_f32(d.as_mut_ptr(), vblend4(t, t, false, w, s, b));
            }
        }
    }
    super::vblend(dst[v..n].iter_mut(), &t[v..n], &u[v..n], two, wy, scale, bias);
}

/// [`vblend`] of three planes into interleaved pixels (NHWC, 3 channels):
/// `dst[3 * i + c]` from `t[c][i]`, `u[c][i]`, `scale[c]`, `bias[c]`; three channels of
/// 4 pixels at a time, interleaved by one `st3`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn vblend3(
    dst: &mut [f32],
    t: [&[f32]; 3],
    u: [&[f32]; 3],
    two: bool,
    wy: f32,
    scale: [f32; 3],
    bias: [f32; 3],
) {
    let u = if two { u } else { t };
    let mut n = dst.len() / 3;
    for c in 0..3 {
        n = n.min(t[c].len()).min(u[c].len());
    }
    let v = n / 4 * 4;
    let s = [vdupq_n_f32(scale[0]), vdupq_n_f32(scale[1]), vdupq_n_f32(scale[2])];
    let b = [vdupq_n_f32(bias[0]), vdupq_n_f32(bias[1]), vdupq_n_f32(bias[2])];
    let w = (vdupq_n_f32(1.0 - wy), vdupq_n_f32(wy));
    for (k, d) in dst[..3 * v].chunks_exact_mut(12).enumerate() {
        let i = 4 * k;
        let mut px = [vdupq_n_f32(0.0); 3];
        for c in 0..3 {
            let (tc, uc) = (&t[c][i..i + 4], &u[c][i..i + 4]);
            // SAFETY: `tc` and `uc` hold exactly 4 f32 (sliced just above).
            px[c] = unsafe {
                vblend4(vld1q_f32(tc.as_ptr()), vld1q_f32(uc.as_ptr()), two, w, s[c], b[c])
            };
        }
        // SAFETY: `d` holds exactly 12 f32 (`chunks_exact_mut(12)`), what `st3` of three
        // 4-lane vectors writes.
        unsafe { vst3q_f32(d.as_mut_ptr(), float32x4x3_t(px[0], px[1], px[2])) };
    }
    for c in 0..3 {
        let dst = dst[3 * v..3 * n].iter_mut().skip(c).step_by(3);
        super::vblend(dst, &t[c][v..n], &u[c][v..n], two, wy, scale[c], bias[c]);
    }
}

/// The f16 store of the first multiple of 8 values of `vals` into `dst` (2 bytes each,
/// little-endian); returns how many were stored.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn store_f16(vals: &[f32], dst: &mut [u8]) -> usize {
    let n = vals.len().min(dst.len() / 2);
    let v = n / 8 * 8;
    for (o, x) in dst[..2 * v].chunks_exact_mut(16).zip(vals[..v].chunks_exact(8)) {
        // SAFETY: `x` holds exactly 8 f32 and `o` 16 bytes (`chunks_exact`): two 128-bit
        // loads, one 128-bit store.
        unsafe {
            let h = f32x8_to_f16x8(vld1q_f32(x.as_ptr()), vld1q_f32(x.as_ptr().add(4)));
            vst1q_u8(o.as_mut_ptr(), vreinterpretq_u8_u16(h));
        }
    }
    v
}

/// Eight f32 to eight f16 (IEEE binary16 bits), rounded to nearest even: `fcvtn`,
/// `fcvtn2` (base AArch64 SIMD; the rounding mode is FPCR's, round to nearest on Linux
/// unless a program changes it, which this one never does).
#[target_feature(enable = "neon")]
#[inline]
unsafe fn f32x8_to_f16x8(lo: float32x4_t, hi: float32x4_t) -> uint16x8_t {
    let out: uint16x8_t;
    // SAFETY: two register-to-register conversions of the base AArch64 SIMD set; no
    // memory, stack or flags are touched.
    unsafe {
        asm!(
            "fcvtn {o:v}.4h, {lo:v}.4s",
            "fcvtn2 {o:v}.8h, {hi:v}.4s",
            o = out(vreg) out,
            lo = in(vreg) lo,
            hi = in(vreg) hi,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// `rgb_to_grey` of 4 pixels: `(9798 R + 19235 G + 3735 B + 2^14) >> 15`, exact in u32.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn grey4(r: uint16x4_t, g: uint16x4_t, b: uint16x4_t) -> uint32x4_t {
    let acc = vmull_n_u16(r, GREY_WEIGHTS[0] as u16);
    let acc = vmlal_n_u16(acc, g, GREY_WEIGHTS[1] as u16);
    let acc = vmlal_n_u16(acc, b, GREY_WEIGHTS[2] as u16);
    let acc = vaddq_u32(acc, vdupq_n_u32(1 << (GREY_SHIFT - 1)));
    vshrq_n_u32::<{ GREY_SHIFT as i32 }>(acc)
}

/// The taps `xs` of a packed 8-bit row (`BPP` bytes per pixel, R G B at byte offsets
/// `rgb`) into the `C` planes of `xs.len()` values of `out`: eight pixels at a time, one
/// `ld3`/`ld4` lane load each (the pixel's bytes spread over 3 or 4 vectors), widened to
/// u32 and converted (exact); grey as `rgb_to_grey`. Returns false, having written
/// nothing, if a tap lies outside the row (never, for checked sampling tables: the
/// caller then runs the portable decoder, which reports it).
#[target_feature(enable = "neon")]
#[inline]
unsafe fn packed8_at<const BPP: usize, const C: usize>(
    row: &[u8],
    rgb: [usize; 3],
    xs: &[i32],
    out: &mut [f32],
) -> bool {
    let n = xs.len();
    // Every tap lies in the row (the sampling tables were checked against the image, so
    // this holds; checked once per row here, where the loads below rely on it).
    let (lo, hi) = xs.iter().fold((i32::MAX, i32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    if n > 0 && (lo < 0 || hi as usize * BPP + BPP > row.len()) {
        return false;
    }
    let v = n / 8 * 8;
    let base = row.as_ptr();
    for (k, x8) in xs[..v].chunks_exact(8).enumerate() {
        let px: [*const u8; 8] = std::array::from_fn(|l| {
            // SAFETY: `0 <= x8[l] <= hi` and `hi * BPP + BPP <= row.len()` (checked
            // above): the pixel's BPP bytes lie in `row`.
            unsafe { base.add(x8[l] as usize * BPP) }
        });
        let z = vdup_n_u8(0);
        let ch: [uint8x8_t; 4] = if BPP == 3 {
            let mut v = uint8x8x3_t(z, z, z);
            // SAFETY: each `px[l]` points at BPP = 3 bytes of `row`, what one `ld3` lane
            // load reads.
            unsafe {
                v = vld3_lane_u8::<0>(px[0], v);
                v = vld3_lane_u8::<1>(px[1], v);
                v = vld3_lane_u8::<2>(px[2], v);
                v = vld3_lane_u8::<3>(px[3], v);
                v = vld3_lane_u8::<4>(px[4], v);
                v = vld3_lane_u8::<5>(px[5], v);
                v = vld3_lane_u8::<6>(px[6], v);
                v = vld3_lane_u8::<7>(px[7], v);
            }
            [v.0, v.1, v.2, z]
        } else {
            let mut v = uint8x8x4_t(z, z, z, z);
            // SAFETY: each `px[l]` points at BPP = 4 bytes of `row`, what one `ld4` lane
            // load reads.
            unsafe {
                v = vld4_lane_u8::<0>(px[0], v);
                v = vld4_lane_u8::<1>(px[1], v);
                v = vld4_lane_u8::<2>(px[2], v);
                v = vld4_lane_u8::<3>(px[3], v);
                v = vld4_lane_u8::<4>(px[4], v);
                v = vld4_lane_u8::<5>(px[5], v);
                v = vld4_lane_u8::<6>(px[6], v);
                v = vld4_lane_u8::<7>(px[7], v);
            }
            [v.0, v.1, v.2, v.3]
        };
        let (r, g, b) = (vmovl_u8(ch[rgb[0]]), vmovl_u8(ch[rgb[1]]), vmovl_u8(ch[rgb[2]]));
        let planes: [[uint32x4_t; 2]; 3] = if C == 1 {
            let lo = grey4(vget_low_u16(r), vget_low_u16(g), vget_low_u16(b));
            let hi = grey4(vget_high_u16(r), vget_high_u16(g), vget_high_u16(b));
            [[lo, hi]; 3]
        } else {
            [
                [vmovl_u16(vget_low_u16(r)), vmovl_high_u16(r)],
                [vmovl_u16(vget_low_u16(g)), vmovl_high_u16(g)],
                [vmovl_u16(vget_low_u16(b)), vmovl_high_u16(b)],
            ]
        };
        for (c, halves) in planes.iter().enumerate().take(C) {
            let dst = &mut out[c * n + 8 * k..c * n + 8 * k + 8];
            // SAFETY: `dst` holds exactly 8 f32, what two 4-lane stores write.
            unsafe {
                vst1q_f32(dst.as_mut_ptr(), vcvtq_f32_u32(halves[0]));
                vst1q_f32(dst.as_mut_ptr().add(4), vcvtq_f32_u32(halves[1]));
            }
        }
    }
    // The last pixels one at a time, as the portable decoder does.
    for (i, &x) in xs.iter().enumerate().skip(v) {
        let p = &row[x as usize * BPP..x as usize * BPP + BPP];
        let (r, g, b) = (u32::from(p[rgb[0]]), u32::from(p[rgb[1]]), u32::from(p[rgb[2]]));
        if C == 1 {
            out[i] = super::decode::rgb_to_grey(r, g, b) as f32;
        } else {
            out[i] = r as f32;
            out[n + i] = g as f32;
            out[2 * n + i] = b as f32;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fcvtn` gives `half::f16::from_f32`'s bits (the portable store) on the values
    /// where a conversion can go wrong: ties to even, the largest finite f16 and the
    /// overflow to infinity, subnormals and their underflow, signed zeros, infinities.
    #[test]
    fn f16_store_equals_the_portable_conversion() {
        let mut vals = vec![
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            65504.0,
            65519.996,
            65520.0,
            -65520.0,
            1e9,
            f32::INFINITY,
            f32::NEG_INFINITY,
            6.1035156e-5,
            6.097555e-5,
            5.9604645e-8,
            2.9802322e-8,
            2.9802326e-8,
            1e-10,
            -1e-10,
            1.0009766,
            1.0004883,
            1.0014648,
            2049.0,
            2051.0,
            -3.3333333,
        ];
        let mut rng = crate::rng::SplitMix64::new(7);
        // Random signs and mantissas, exponents from below f16's subnormals (2^-27) to
        // above its range (2^18); no NaN (no tensor value is one).
        vals.extend((0..4000).map(|_| {
            let (sign, exp, mant) =
                (rng.below(2) as u32, 100 + rng.below(46) as u32, rng.next() as u32);
            f32::from_bits(sign << 31 | exp << 23 | (mant & 0x7f_ffff))
        }));
        vals.truncate(vals.len() / 8 * 8);
        let mut neon = vec![0u8; 2 * vals.len()];
        assert!(std::arch::is_aarch64_feature_detected!("neon"));
        // SAFETY: NEON was detected just above.
        let stored = unsafe { store_f16(&vals, &mut neon) };
        assert_eq!(stored, vals.len());
        for (i, v) in vals.iter().enumerate() {
            let want = half::f16::from_f32(*v).to_bits();
            let got = u16::from_le_bytes([neon[2 * i], neon[2 * i + 1]]);
            assert_eq!(got, want, "f16 of {v:e} ({:#010x}): fcvtn {got:#06x}", v.to_bits());
        }
    }
}
