// resize_normalize.cu: the fused preprocessing, ONE launch per frame that reads the
// source bytes once and writes the tensor once:
//   decode (any encoding) -> ROI -> bilinear/nearest sample -> letterbox pad or crop
//   -> normalize -> channel order -> NCHW/NHWC store in float32 or float16.
//
// Layouts
//   src   the frame as received (sensor_msgs/Image data): src_height rows of src_step
//         bytes; NV12/NV21 append src_height/2 interleaved chroma rows of src_step bytes.
//         The buffer carries at least 16 bytes of padding after the frame (SRC_SLACK):
//         the span path reads whole aligned 8-byte vectors, up to 7 bytes past the last
//         byte it needs, and the staged path whole aligned 32-bit words, up to 3.
//   maps  the sampling tables of src/backend/ops.rs AxisMap as int32, x then y:
//         [x_i0 | x_i1 | x_w1 (f32 bits)] (content_w each), [y_i0 | y_i1 | y_w1]
//         (content_h each). Indices are absolute source pixels (ROI already applied).
//   dst   (C, H, W) planar (NCHW) or (H, W, C) interleaved (NHWC), dense, float32 or
//         float16 bits; 16-byte aligned.
// Launch shape
//   block (RN_BLOCK_X, RN_BLOCK_Y) = (16, 16); each thread writes RN_PX = 4 adjacent
//   pixels of one row (one 16-byte store per channel for NCHW float32 when W % 4 == 0),
//   so a block covers a 64 x 16 tile; 1-D grid of min(tiles, resident blocks) persistent
//   blocks, each looping over tiles t = blockIdx.x, + gridDim.x, ... (row-major).
//   Direct path: each thread reads its groups' x table entries from global memory (16-byte
//   vectors when content_x and content_w are multiples of 4), so no shared memory and no
//   barrier. Staged path: the tile's x table (3 * 64 int32, static shared memory) and
//   2 * RN_BLOCK_Y * row_words * 4 bytes of dynamic shared memory, two barriers per tile.
//   Register caps (__launch_bounds__): 4 blocks of 256 threads per SM (64 registers) for
//   the entry points with the span path and the batch kernel, 5 (48) for the others.
// Reference behaviour: src/backend/cpu (the specification). Per output pixel: outside
//   the content rectangle -> pad[c]; else four taps (i0/i1 of each axis) decoded to RGB in
//   8-bit units (16-bit samples / 257), bilinear in float, horizontal then vertical
//   (top = s00*(1-wx) + s01*wx, bottom likewise, v = top*(1-wy) + bottom*wy) = the
//   sampling of cv2.resize INTER_LINEAR / INTER_NEAREST through the same host tables;
//   grey output from colour: OpenCV 5.0 RGB2GRAY 15-bit fixed point on each tap before
//   interpolation; YUV: BT.601 20-bit fixed point; Bayer: OpenCV's bilinear demosaic
//   with its border copies (all as src/backend/cpu/decode.rs, which cites the OpenCV
//   code); then v*scale[c] + bias[c]; float16 rounds to nearest even. All arithmetic is
//   __fmul_rn/__fadd_rn (never contracted into FMA), so each value is bit-identical to
//   the CPU's (src/backend/cpu/reference.rs, element()).
// Direct path (default): taps are read from global memory through L1. rgb8, bgr8, rgba8
//   and bgra8 with a linear x table of stride 2 or 3 over a group of 4 pixels (exact 2x or
//   3x horizontal downscales: 3840 -> 1920, 1920 -> 640, ...) take the span path below:
//   the group's contiguous source bytes of each row as aligned 8-byte vectors, bytes
//   selected at compile time; at an exact 2x in both axes (every weight 0.5) the four
//   taps are summed as integers (the midpoint path, exact). Everything else byte by byte.
// Staged path (compiled with -DRN_STAGED=1; the host passes row_words > 0 for encodings
//   whose pixel x starts at byte x*bpp of its row, when the widest tile window fits): the
//   block copies, with cp.async 32-bit copies, the source columns its tile samples from
//   each of the two source rows of each of its 16 output rows into shared memory, then
//   samples there. Measured slower than the direct path on the H200 (docs/GPU.md).
// The kernel lab (bench/klab/) builds its variants of this kernel by patching this file
//   (klab_variants.py): test/python/test_klab.py checks that every patch still applies.
#include "common.cuh"

// RN_PX, RN_BLOCK_X, RN_BLOCK_Y come from the host (src/backend/cuda/launch.rs).
#define RN_THREADS (RN_BLOCK_X * RN_BLOCK_Y)
#define RN_TILE_W (RN_BLOCK_X * RN_PX)
#define RN_TILE_H RN_BLOCK_Y
// Blocks per SM the register allocation must allow (__launch_bounds__): 5 keeps the
// entry points of encodings without the span path at <= 48 registers with no spill on
// sm_87 and sm_90 (5 x 256 threads per SM); without the cap the persistent loop took 56
// on sm_90 (4 blocks per SM).
#define RN_MIN_BLOCKS 5
// The same for the entry points with the span path (rgb8, bgr8, rgba8, bgra8) and the
// batch kernel (which holds every encoding's code): 4 (64 registers, no spill). At 5 (48
// registers) the span path spills (32-96 bytes of local memory per thread): measured on
// the H200 at 4K, 20.6 us at 5 against 18.9 us at 4 (docs/evidence/gpu_history.md,
// version 8).
#define RN_MIN_BLOCKS_SPAN 4
// 1: compile the staged (shared-memory window) path into the entry points; the host
// then passes row_words > 0 where the window fits. 0 (default): direct path only, which
// needs fewer registers (48 instead of 56 for rgb8 on sm_90: 5 blocks per SM instead of 4).
#ifndef RN_STAGED
#define RN_STAGED 0
#endif

// OpenCV's BT.601 YUV -> RGB fixed point (color_yuv.simd.hpp, ITUR_BT_601_*).
#define YUV_SHIFT 20
#define YUV_CY 1220542
#define YUV_CUB 2116026
#define YUV_CUG (-409993)
#define YUV_CVG (-852492)
#define YUV_CVR 1673527
// OpenCV 5.0's RGB2GRAY fixed point, 15 bits, u8 and u16 alike (src/backend/cpu/decode.rs
// GREY_WEIGHTS: 0.299, 0.587, 0.114 scaled by 2^15, summing to 2^15).
#define GRAY_SHIFT 15
#define GRAY_R 9798u
#define GRAY_G 19235u
#define GRAY_B 3735u

// Bytes per pixel of the (first) plane and packing, from the host's table (VP_ENCODINGS).
#define RN_BPP_OF(name, code, bpp, packed) e == code ? bpp :
#define RN_PACKED_OF(name, code, bpp, packed) e == code ? (packed != 0) :
__device__ constexpr u32 enc_bpp(u32 e) { return VP_ENCODINGS(RN_BPP_OF) 1; }
__device__ constexpr bool enc_is_16bit(u32 e) { return e == ENC_MONO16 || e == ENC_RGB16 || e == ENC_BGR16; }
__device__ constexpr bool enc_is_mono(u32 e) { return e == ENC_MONO8 || e == ENC_MONO16; }
__device__ constexpr bool enc_is_yuv422(u32 e) { return e == ENC_YUYV || e == ENC_UYVY; }
// Pixel x of a row starts at byte x*bpp (4:2:2: its pair starts at (x & ~1) * 2).
__device__ constexpr bool enc_is_packed(u32 e) { return VP_ENCODINGS(RN_PACKED_OF) false; }

__device__ __forceinline__ int clamp_u8(int v) { return v < 0 ? 0 : (v > 255 ? 255 : v); }

// Copy 4 bytes global -> shared without a register round trip (sm_80+: cp.async), so a
// thread has all its staging loads in flight at once; plain copy on older GPUs.
__device__ __forceinline__ void cp_async4(u32* smem, const u32* gmem) {
#if __CUDA_ARCH__ >= 800
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
#else
    *smem = *gmem;
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// One row of source bytes: pixel x of encoding ENC starts at base[off + x * bpp].
struct Row {
    const u8* base;
    int off;
};

// A decoded tap in source integer units (8 or 16 bits): r, g, b.
struct Rgb {
    int r, g, b;
};

__device__ __forceinline__ int rd16(const u8* q, u32 big_endian) {
    return big_endian ? (q[0] << 8 | q[1]) : (q[1] << 8 | q[0]);
}

__device__ __forceinline__ Rgb yuv_to_rgb(int yy, int u, int v) {
    const int y = max(0, yy - 16) * YUV_CY;
    const int uu = u - 128, vv = v - 128;
    const int ruv = (1 << (YUV_SHIFT - 1)) + YUV_CVR * vv;
    const int guv = (1 << (YUV_SHIFT - 1)) + YUV_CVG * vv + YUV_CUG * uu;
    const int buv = (1 << (YUV_SHIFT - 1)) + YUV_CUB * uu;
    Rgb o;
    o.r = clamp_u8((y + ruv) >> YUV_SHIFT);
    o.g = clamp_u8((y + guv) >> YUV_SHIFT);
    o.b = clamp_u8((y + buv) >> YUV_SHIFT);
    return o;
}

// Packed encodings: the tap at column x of `row`.
template <u32 ENC>
__device__ __forceinline__ Rgb decode_packed(Row row, int x, u32 big_endian) {
    Rgb o;
    if constexpr (enc_is_yuv422(ENC)) {
        const u8* q = row.base + row.off + (x & ~1) * 2;
        // yuyv: Y0 U Y1 V; uyvy: U Y0 V Y1
        const int yy = ENC == ENC_YUYV ? q[(x & 1) * 2] : q[(x & 1) * 2 + 1];
        const int u = ENC == ENC_YUYV ? q[1] : q[0];
        const int v = ENC == ENC_YUYV ? q[3] : q[2];
        return yuv_to_rgb(yy, u, v);
    } else {
        const u8* q = row.base + row.off + x * (int)enc_bpp(ENC);
        if constexpr (ENC == ENC_RGB8 || ENC == ENC_RGBA8) {
            o.r = q[0]; o.g = q[1]; o.b = q[2];
        } else if constexpr (ENC == ENC_BGR8 || ENC == ENC_BGRA8) {
            o.r = q[2]; o.g = q[1]; o.b = q[0];
        } else if constexpr (ENC == ENC_MONO8) {
            o.r = o.g = o.b = q[0];
        } else if constexpr (ENC == ENC_MONO16) {
            o.r = o.g = o.b = rd16(q, big_endian);
        } else if constexpr (ENC == ENC_RGB16) {
            o.r = rd16(q, big_endian); o.g = rd16(q + 2, big_endian); o.b = rd16(q + 4, big_endian);
        } else {  // ENC_BGR16
            o.r = rd16(q + 4, big_endian); o.g = rd16(q + 2, big_endian); o.b = rd16(q, big_endian);
        }
        return o;
    }
}

// NV12/NV21: Y at (x, y), chroma pair at (x/2, y/2) of the plane after the Y rows.
template <u32 ENC>
__device__ __forceinline__ Rgb decode_nv(const PreprocessParams& p, const u8* src, int x, int y) {
    const int yy = src[(unsigned long long)y * p.src_step + x];
    const u8* c = src + (unsigned long long)(p.src_height + (y >> 1)) * p.src_step + (x & ~1);
    const int u = ENC == ENC_NV12 ? c[0] : c[1];
    const int v = ENC == ENC_NV12 ? c[1] : c[0];
    return yuv_to_rgb(yy, u, v);
}

// Bayer: colour of the mosaic at (x, y): 0 = R, 1 = G, 2 = B.
template <u32 ENC>
__device__ __forceinline__ int bayer_colour(int x, int y) {
    // first row / second row of the 2x2 cell, left to right
    constexpr int c00 = ENC == ENC_BAYER_RGGB8 ? 0 : ENC == ENC_BAYER_BGGR8 ? 2 : 1;
    constexpr int c01 = ENC == ENC_BAYER_RGGB8 ? 1 : ENC == ENC_BAYER_BGGR8 ? 1
                      : ENC == ENC_BAYER_GBRG8 ? 2 : 0;
    constexpr int c10 = ENC == ENC_BAYER_RGGB8 ? 1 : ENC == ENC_BAYER_BGGR8 ? 1
                      : ENC == ENC_BAYER_GBRG8 ? 0 : 2;
    constexpr int c11 = ENC == ENC_BAYER_RGGB8 ? 2 : ENC == ENC_BAYER_BGGR8 ? 0 : 1;
    return (y & 1) ? ((x & 1) ? c11 : c10) : ((x & 1) ? c01 : c00);
}

// OpenCV's bilinear demosaic (demosaicing.cpp Bayer2RGB_): interior pixels from their
// 3x3 neighbourhood; the first/last column copy their neighbour column, then the
// first/last row copy their neighbour row; images narrower or shorter than 3 are 0.
template <u32 ENC>
__device__ __forceinline__ Rgb decode_bayer(const PreprocessParams& p, const u8* src, int x, int y) {
    Rgb o;
    const int w = p.src_width, h = p.src_height;
    if (w < 3 || h < 3) {
        o.r = o.g = o.b = 0;
        return o;
    }
    x = min(max(x, 1), w - 2);
    y = min(max(y, 1), h - 2);
    const unsigned long long s = p.src_step;
    const u8* c = src + (unsigned long long)y * s + x;
    const int here = c[0];
    const int n = c[-(long long)s], so = c[s], we = c[-1], ea = c[1];
    const int col = bayer_colour<ENC>(x, y);
    if (col == 1) {
        const int hor = (we + ea + 1) >> 1, ver = (n + so + 1) >> 1;
        // colour of the horizontal neighbours
        const int hcol = bayer_colour<ENC>(x + 1, y);
        o.g = here;
        if (hcol == 0) { o.r = hor; o.b = ver; } else { o.b = hor; o.r = ver; }
    } else {
        const int cross = (n + so + we + ea + 2) >> 2;
        const int diag = (c[-(long long)s - 1] + c[-(long long)s + 1] + c[s - 1] + c[s + 1] + 2) >> 2;
        o.g = cross;
        if (col == 0) { o.r = here; o.b = diag; } else { o.b = here; o.r = diag; }
    }
    return o;
}

// A decoded tap as floats in 8-bit units: v[0..3] = R, G, B, or v[0] = grey when `grey`.
template <u32 ENC>
__device__ __forceinline__ void to_float(Rgb t, bool grey, float v[3]) {
    if (grey && !enc_is_mono(ENC)) {
        // unsigned: 16-bit samples reach 65535 * 2^15 + 2^14 > INT_MAX... just below 2^31
        const u32 g = ((u32)t.r * GRAY_R + (u32)t.g * GRAY_G + (u32)t.b * GRAY_B +
                       (1u << (GRAY_SHIFT - 1))) >> GRAY_SHIFT;
        t.r = (int)g;
    }
    if constexpr (enc_is_16bit(ENC)) {
        v[0] = __fdiv_rn((float)t.r, 257.0f);
        v[1] = __fdiv_rn((float)t.g, 257.0f);
        v[2] = __fdiv_rn((float)t.b, 257.0f);
    } else {
        v[0] = (float)t.r;
        v[1] = (float)t.g;
        v[2] = (float)t.b;
    }
}

// One tap as floats (see to_float).
template <u32 ENC>
__device__ __forceinline__ void tap(const PreprocessParams& p, const u8* src, Row row, int x,
                                    int y, bool grey, float v[3]) {
    Rgb t;
    if constexpr (enc_is_packed(ENC)) {
        t = decode_packed<ENC>(row, x, p.big_endian);
    } else if constexpr (ENC == ENC_NV12 || ENC == ENC_NV21) {
        t = decode_nv<ENC>(p, src, x, y);
    } else {
        t = decode_bayer<ENC>(p, src, x, y);
    }
    to_float<ENC>(t, grey, v);
}

__device__ __forceinline__ float lerp_rn(float a, float b, float w) {
    // a*(1-w) + b*w, each operation rounded (= the CPU's Rust expression)
    return __fadd_rn(__fmul_rn(a, __fsub_rn(1.0f, w)), __fmul_rn(b, w));
}

// ---- The span path: 8-bit rgb8/bgr8/rgba8/bgra8 with a linear x table that is an
// integer-stride downscale over a group's 4 pixels (i0[k] = i0[0] + S*k, i1[k] = i0[k] +
// 1, S = 2 or 3: e.g. 3840 -> 1920, 1920 -> 640, 1280 -> 640). The 8 taps of a group in
// one source row lie in (3S + 2) * bpp contiguous bytes (24 to 44): the thread reads them
// with aligned 8-byte vector loads (every load of the group in flight at once), realigns
// them with funnel shifts, and takes each tap's bytes with compile-time selectors: 2 x
// 3-5 vector loads per 4 pixels instead of 48 byte loads, and a warp's 32 loads touch the
// same L1 lines as its byte loads did, with 8-16 x fewer wavefronts. Any other table,
// encoding, interpolation, a group that leaves the content rectangle, or a frame base
// not 8-byte aligned takes the byte path per group. Same values bit for bit (the bytes
// are the same bytes; the arithmetic is unchanged). Reads up to 7 bytes past the last
// byte a group needs, inside the aligned vector that holds it: the frame buffers carry
// SRC_SLACK (16) bytes after the frame and are rounded up to 64 bytes, zeroed when
// allocated.
static_assert(RN_PX % 4 == 0, "RN_PX: whole groups of 4 pixels");
__device__ constexpr bool enc_span(u32 e) {
    return e == ENC_RGB8 || e == ENC_BGR8 || e == ENC_RGBA8 || e == ENC_BGRA8;
}

// Blocks per SM of the register cap of encoding e's entry point.
__device__ constexpr int rn_min_blocks(u32 e) { return enc_span(e) ? RN_MIN_BLOCKS_SPAN : RN_MIN_BLOCKS; }

// Load the aligned 8-byte vectors that cover the SPAN bytes at `addr` (global memory,
// read-only) and realign them: a[j] = bytes 4j .. 4j + 3 of the span.
template <int SPAN>
__device__ __forceinline__ void load_span(const u8* addr, u32 (&a)[(SPAN + 3) / 4]) {
    constexpr int NW = (SPAN + 3) / 4;
    constexpr int NV = (SPAN + 14) / 8;  // vectors at the worst misalignment (7 bytes)
    constexpr int NR = 2 * NV;           // their words
    const unsigned long long pa = (unsigned long long)addr;
    const u32 m = (u32)pa & 7u;
    const unsigned long long base = pa - m;
    u32 w[NR + 1];
#pragma unroll
    for (int v = 0; v < NV; ++v) {
        // a vector past the span's last byte is not read (it may lie past the buffer)
        const bool need = v == 0 || (u32)(v * 8) < m + SPAN;
        uint2 q = make_uint2(0, 0);
        if (need) q = __ldg((const uint2*)(base + v * 8));
        w[2 * v] = q.x; w[2 * v + 1] = q.y;
    }
    w[NR] = 0;
    const u32 sh = (m & 3) * 8;
    u32 t[NR];
#pragma unroll
    for (int i = 0; i < NR; ++i) t[i] = __funnelshift_r(w[i], w[i + 1], sh);
    // one whole word to skip when m >= 4 (in place, ascending: t[i] reads t[i + 1] before
    // it is overwritten)
#pragma unroll
    for (int i = 0; i + 1 < NR; ++i) t[i] = (m & 4) ? t[i + 1] : t[i];
#pragma unroll
    for (int j = 0; j < NW; ++j) a[j] = t[j];
}

// Byte J of a realigned span, as a float (exact): the byte put into the mantissa of 2^23
// (one PRMT), minus 2^23 (one FADD), instead of a quarter-rate I2F.
template <int J, int NW>
__device__ __forceinline__ float span_byte(const u32 (&a)[NW]) {
    static_assert(J / 4 < NW, "span byte out of range");
    // 0x4B0000bb: 2^23 + b, exactly; minus 2^23 = b
    return __fsub_rn(__uint_as_float(__byte_perm(a[J / 4], 0x4B000000u, 0x7540u | (J % 4))), 8388608.0f);
}

// Tap (column offset COL from the group's first tap) of a realigned span: R, G, B.
template <u32 ENC, int COL, int NW>
__device__ __forceinline__ void span_tap(const u32 (&a)[NW], float v[3]) {
    constexpr int bpp = enc_bpp(ENC);
    constexpr bool bgr = ENC == ENC_BGR8 || ENC == ENC_BGRA8;
    v[0] = span_byte<COL * bpp + (bgr ? 2 : 0)>(a);
    v[1] = span_byte<COL * bpp + 1>(a);
    v[2] = span_byte<COL * bpp + (bgr ? 0 : 2)>(a);
}

// Channel CH (0 R, 1 G, 2 B) of pixel K of a group through the span path, stride S.
template <u32 ENC, int S, int K, int CH, int NW>
__device__ __forceinline__ float span_value(const u32 (&a0)[NW], const u32 (&a1)[NW], float wx, float wy) {
    constexpr int bpp = enc_bpp(ENC);
    constexpr bool bgr = ENC == ENC_BGR8 || ENC == ENC_BGRA8;
    constexpr int off = CH == 1 ? 1 : ((CH == 0) != bgr ? 0 : 2);
    constexpr int j0 = S * K * bpp + off, j1 = (S * K + 1) * bpp + off;
    const float s00 = span_byte<j0>(a0), s01 = span_byte<j1>(a0);
    const float s10 = span_byte<j0>(a1), s11 = span_byte<j1>(a1);
    return lerp_rn(lerp_rn(s00, s01, wx), lerp_rn(s10, s11, wx), wy);
}

// The group's 4 pixels of source channel CH, normalized with (scale, bias).
template <u32 ENC, int S, int CH, int NW>
__device__ __forceinline__ void span_channel(const u32 (&a0)[NW], const u32 (&a1)[NW], const float wxs[4],
                                             float wy, float scale, float bias, float o[4]) {
    o[0] = __fadd_rn(__fmul_rn(span_value<ENC, S, 0, CH>(a0, a1, wxs[0], wy), scale), bias);
    o[1] = __fadd_rn(__fmul_rn(span_value<ENC, S, 1, CH>(a0, a1, wxs[1], wy), scale), bias);
    o[2] = __fadd_rn(__fmul_rn(span_value<ENC, S, 2, CH>(a0, a1, wxs[2], wy), scale), bias);
    o[3] = __fadd_rn(__fmul_rn(span_value<ENC, S, 3, CH>(a0, a1, wxs[3], wy), scale), bias);
}

// The exact 2x midpoint (docs/evidence/gpu_history.md, version 10: the 4K case 3 %
// faster in events, 9 % in the kernel's own duration, 26 % fewer instructions). When a
// group's four x weights and its y weight are all 0.5 (a 2x downscale through the
// tables' half-pixel sampling: 3840 -> 1920, 1280 -> 640, ...), the specification's
// s00*(1-w) + s01*w, horizontal then vertical, is (s00 + s01 + s10 + s11) / 4 exactly:
// every intermediate is a multiple of 1/4 below 256, exact in float32. So the four
// bytes are summed as integers (IDP4A with a mask of ones on the two bytes of each row's
// word, accumulated into the mantissa of 2^23), and one FMA, exact because its result is
// representable, takes sum / 4 out of it: ~6 instructions per value instead of ~19
// (4 conversions, 3 lerps), the same bits.

// (a0[J0] + a0[J1] + a1[J0] + a1[J1]) / 4 of two realigned spans, exactly.
template <int J0, int J1, int NW>
__device__ __forceinline__ float mid_value(const u32 (&a0)[NW], const u32 (&a1)[NW]) {
    static_assert(J0 / 4 < NW && J1 / 4 < NW, "span byte out of range");
    constexpr int w0 = J0 / 4, w1 = J1 / 4;
    constexpr u32 m0 = 1u << (8 * (J0 % 4)), m1 = 1u << (8 * (J1 % 4));
    u32 s = 0x4B000000u;  // 2^23 as float bits: the sum lands in the mantissa (< 2^23)
    if constexpr (w0 == w1) {
        s = __dp4a(a0[w0], m0 | m1, s);
        s = __dp4a(a1[w0], m0 | m1, s);
    } else {
        s = __dp4a(a0[w0], m0, s);
        s = __dp4a(a0[w1], m1, s);
        s = __dp4a(a1[w0], m0, s);
        s = __dp4a(a1[w1], m1, s);
    }
    // (2^23 + sum) * 0.25 - 2^21 = sum / 4: exact, so one rounding changes nothing.
    return __fmaf_rn(__uint_as_float(s), 0.25f, -2097152.0f);
}

// Channel CH of pixel K of a stride-2 group at the midpoint.
template <u32 ENC, int K, int CH, int NW>
__device__ __forceinline__ float span_mid(const u32 (&a0)[NW], const u32 (&a1)[NW]) {
    constexpr int bpp = enc_bpp(ENC);
    constexpr bool bgr = ENC == ENC_BGR8 || ENC == ENC_BGRA8;
    constexpr int off = CH == 1 ? 1 : ((CH == 0) != bgr ? 0 : 2);
    return mid_value<2 * K * bpp + off, (2 * K + 1) * bpp + off>(a0, a1);
}

// span_channel, or its midpoint form when `mid` (stride 2 only).
template <u32 ENC, int S, int CH, int NW>
__device__ __forceinline__ void span_channel_any(const u32 (&a0)[NW], const u32 (&a1)[NW], const float wxs[4],
                                                 float wy, bool mid, float scale, float bias, float o[4]) {
    if constexpr (S == 2) {
        if (mid) {
            o[0] = __fadd_rn(__fmul_rn(span_mid<ENC, 0, CH>(a0, a1), scale), bias);
            o[1] = __fadd_rn(__fmul_rn(span_mid<ENC, 1, CH>(a0, a1), scale), bias);
            o[2] = __fadd_rn(__fmul_rn(span_mid<ENC, 2, CH>(a0, a1), scale), bias);
            o[3] = __fadd_rn(__fmul_rn(span_mid<ENC, 3, CH>(a0, a1), scale), bias);
            return;
        }
    }
    span_channel<ENC, S, CH>(a0, a1, wxs, wy, scale, bias, o);
}

// True when the group's x table is the stride-S pattern of the span path.
template <int S>
__device__ __forceinline__ bool span_pattern(const int xs0s[4], const int xs1s[4]) {
    bool ok = true;
#pragma unroll
    for (int k = 0; k < 4; ++k) ok = ok && xs0s[k] == xs0s[0] + S * k && xs1s[k] == xs0s[k] + 1;
    return ok;
}

// Store a group of 4 pixels (x0 .. x0 + 3 of row y; x0 % 4 == 0).
__device__ __forceinline__ void store_group(const PreprocessParams& p, void* __restrict__ dst,
                                            int x0, int y, const float (&out)[4][3]) {
    const int W = p.dst_width, H = p.dst_height;
    const int C = p.channels;
    if ((W & 3) == 0) {  // then x0 + 3 < W and every vector below is aligned
        if (p.layout == LAYOUT_NCHW || C == 1) {
#pragma unroll
            for (int c = 0; c < 3; ++c) {
                if (c >= C) break;
                const unsigned long long i = ((unsigned long long)c * H + y) * W + x0;
                if (p.dtype == DTYPE_F32) {
                    *(float4*)((float*)dst + i) = make_float4(out[0][c], out[1][c], out[2][c], out[3][c]);
                } else {
                    uint2 h;
                    h.x = f32_to_f16_bits(out[0][c]) | (u32)f32_to_f16_bits(out[1][c]) << 16;
                    h.y = f32_to_f16_bits(out[2][c]) | (u32)f32_to_f16_bits(out[3][c]) << 16;
                    *(uint2*)((u16*)dst + i) = h;
                }
            }
        } else {  // NHWC, 3 channels: 12 consecutive values
            const unsigned long long i = ((unsigned long long)y * W + x0) * 3;
            if (p.dtype == DTYPE_F32) {
                float4* d = (float4*)((float*)dst + i);
                d[0] = make_float4(out[0][0], out[0][1], out[0][2], out[1][0]);
                d[1] = make_float4(out[1][1], out[1][2], out[2][0], out[2][1]);
                d[2] = make_float4(out[2][2], out[3][0], out[3][1], out[3][2]);
            } else {
                uint2* d = (uint2*)((u16*)dst + i);
                uint2 h;
                h.x = f32_to_f16_bits(out[0][0]) | (u32)f32_to_f16_bits(out[0][1]) << 16;
                h.y = f32_to_f16_bits(out[0][2]) | (u32)f32_to_f16_bits(out[1][0]) << 16;
                d[0] = h;
                h.x = f32_to_f16_bits(out[1][1]) | (u32)f32_to_f16_bits(out[1][2]) << 16;
                h.y = f32_to_f16_bits(out[2][0]) | (u32)f32_to_f16_bits(out[2][1]) << 16;
                d[1] = h;
                h.x = f32_to_f16_bits(out[2][2]) | (u32)f32_to_f16_bits(out[3][0]) << 16;
                h.y = f32_to_f16_bits(out[3][1]) | (u32)f32_to_f16_bits(out[3][2]) << 16;
                d[2] = h;
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (x0 + k >= W) break;
#pragma unroll
            for (int c = 0; c < 3; ++c) {
                if (c >= C) break;
                store_elem(dst, p.dtype, tensor_index(p.layout, C, H, W, c, y, x0 + k), out[k][c]);
            }
        }
    }
}

// A group of 4 pixels through the span path, stride S. Planar (NCHW) output with
// W % 4 == 0 is written one source channel at a time (4 values live, not 12) into the
// plane the channel order gives it; otherwise all 12 values, then store_group.
template <u32 ENC, int S>
__device__ __forceinline__ void span_group(const PreprocessParams& p, void* __restrict__ dst,
                                           const u8* row0, const u8* row1, int xs, const float wxs[4],
                                           float wy, bool swap, int x0, int y) {
    constexpr int SPAN = (3 * S + 2) * enc_bpp(ENC);
    constexpr int NW = (SPAN + 3) / 4;
    u32 a0[NW], a1[NW];
    load_span<SPAN>(row0 + xs * (int)enc_bpp(ENC), a0);
    load_span<SPAN>(row1 + xs * (int)enc_bpp(ENC), a1);
    const int W = p.dst_width, H = p.dst_height;
    // the exact 2x midpoint (all five weights 0.5): integer sums, the same bits
    const bool mid = S == 2 && wy == 0.5f && wxs[0] == 0.5f && wxs[1] == 0.5f && wxs[2] == 0.5f &&
                     wxs[3] == 0.5f;
    if (p.layout == LAYOUT_NCHW && (W & 3) == 0) {
        float o[4];
        const unsigned long long plane = (unsigned long long)H * W;
        const unsigned long long i = (unsigned long long)y * W + x0;
#pragma unroll
        for (int sc = 0; sc < 3; ++sc) {  // source channel R, G, B -> output plane c
            const int c = swap ? 2 - sc : sc;
            const float scale = c == 0 ? p.scale[0] : (c == 1 ? p.scale[1] : p.scale[2]);
            const float bias = c == 0 ? p.bias[0] : (c == 1 ? p.bias[1] : p.bias[2]);
            if (sc == 0) span_channel_any<ENC, S, 0>(a0, a1, wxs, wy, mid, scale, bias, o);
            if (sc == 1) span_channel_any<ENC, S, 1>(a0, a1, wxs, wy, mid, scale, bias, o);
            if (sc == 2) span_channel_any<ENC, S, 2>(a0, a1, wxs, wy, mid, scale, bias, o);
            if (p.dtype == DTYPE_F32) {
                *(float4*)((float*)dst + c * plane + i) = make_float4(o[0], o[1], o[2], o[3]);
            } else {
                uint2 h;
                h.x = f32_to_f16_bits(o[0]) | (u32)f32_to_f16_bits(o[1]) << 16;
                h.y = f32_to_f16_bits(o[2]) | (u32)f32_to_f16_bits(o[3]) << 16;
                *(uint2*)((u16*)dst + c * plane + i) = h;
            }
        }
    } else {
        float out[4][3], o[4];
        const float sc0 = swap ? p.scale[2] : p.scale[0], bi0 = swap ? p.bias[2] : p.bias[0];
        const float sc2 = swap ? p.scale[0] : p.scale[2], bi2 = swap ? p.bias[0] : p.bias[2];
        span_channel_any<ENC, S, 0>(a0, a1, wxs, wy, mid, sc0, bi0, o);  // R -> plane 0 (2 when swapped)
#pragma unroll
        for (int k = 0; k < 4; ++k) out[k][0] = o[k];
        span_channel_any<ENC, S, 1>(a0, a1, wxs, wy, mid, p.scale[1], p.bias[1], o);
#pragma unroll
        for (int k = 0; k < 4; ++k) out[k][1] = o[k];
        span_channel_any<ENC, S, 2>(a0, a1, wxs, wy, mid, sc2, bi2, o);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            out[k][2] = swap ? out[k][0] : o[k];
            out[k][0] = swap ? o[k] : out[k][0];
        }
        store_group(p, dst, x0, y, out);
    }
}

// The per-thread part: RN_PX adjacent pixels of one output row, in groups of 4. STAGED
// selects where packed encodings read their bytes: the shared-memory window (STAGED) or
// global memory (direct). Separate instantiations keep every load in a known address
// space (LDS/LDG, never generic) and every array index compile-time (no local memory).
template <u32 ENC, bool STAGED>
__device__ __forceinline__ void rn_pixels(const PreprocessParams& p, const u8* __restrict__ src,
                                          const int* __restrict__ maps, void* __restrict__ dst,
                                          u32 row_words, int ws, const int* s_xtab,
                                          int tile_x0, int tile_y0) {
    extern __shared__ u32 rn_smem[];
    const int y = tile_y0 + threadIdx.y;
    const int W = p.dst_width, H = p.dst_height;
    if (y >= H || tile_x0 + (int)threadIdx.x * RN_PX >= W) return;
    const int cx = p.content_x, cy = p.content_y, cw = p.content_w, chh = p.content_h;
    const int* y_i0 = maps + 3 * cw;
    const int* y_i1 = y_i0 + chh;
    const float* y_w1 = (const float*)(y_i1 + chh);
    const bool grey = p.channels == 1;
    const bool swap = p.swap_rb != 0;
    const bool row_in = y >= cy && y < cy + chh;
    const bool nearest = p.interpolation == INTERP_NEAREST;

    int yr0 = 0, yr1 = 0;
    float wy = 0.0f;
    if (row_in) {
        yr0 = y_i0[y - cy];
        yr1 = y_i1[y - cy];
        wy = y_w1[y - cy];
    }
    // Row bases are never a mix of shared and global pointers (that would make every load
    // generic): shared rows in the staged instantiation, global rows in the direct one.
    Row r0, r1;
    if constexpr (STAGED) {
        constexpr int bpp = enc_bpp(ENC);
        const int wsb = ws * bpp;
        r0.base = (const u8*)(rn_smem + threadIdx.y * row_words);
        r1.base = (const u8*)(rn_smem + (RN_TILE_H + threadIdx.y) * row_words);
        r0.off = (int)(((unsigned long long)yr0 * p.src_step + wsb) & 3) - wsb;
        r1.off = (int)(((unsigned long long)yr1 * p.src_step + wsb) & 3) - wsb;
    } else {
        r0.base = src + (unsigned long long)yr0 * p.src_step;
        r1.base = src + (unsigned long long)yr1 * p.src_step;
        r0.off = 0;
        r1.off = 0;
    }
    // The span path needs its aligned 8-byte vectors to start inside the frame buffer.
    // Direct path: the x table as 16-byte vectors when every group of 4 lies wholly inside
    // or outside the content (content_x and content_w multiples of 4; the table is
    // 16-byte aligned), else element by element.
    const bool tab_vec = ((cx | cw) & 3) == 0;
    // Grey output converts each tap before interpolation: the byte path does that.
    const bool span_ok = !STAGED && enc_span(ENC) && !nearest && !grey && row_in &&
                         ((unsigned long long)src & 7) == 0;

#pragma unroll
    for (int g = 0; g < RN_PX / 4; ++g) {
        const int x0 = tile_x0 + threadIdx.x * RN_PX + 4 * g;
        if (x0 >= W) break;
        // This group's 4 entries of the x table, 0 outside the content: staged in shared
        // memory (staged path), or read from global memory through L1 (direct path: no
        // barrier per tile, so the block's warps never wait for each other).
        int4 xi0, xi1;
        float4 xw;
        if constexpr (STAGED) {
            const int* tx = s_xtab + threadIdx.x * RN_PX + 4 * g;
            xi0 = *(const int4*)tx;
            xi1 = *(const int4*)(tx + RN_TILE_W);
            xw = *(const float4*)(tx + 2 * RN_TILE_W);
        } else if (tab_vec) {  // the group lies wholly inside or outside the content
            if (x0 >= cx && x0 < cx + cw) {
                const int* t = maps + (x0 - cx);
                xi0 = __ldg((const int4*)t);
                xi1 = __ldg((const int4*)(t + cw));
                xw = __ldg((const float4*)(t + 2 * cw));
            } else {
                xi0 = xi1 = make_int4(0, 0, 0, 0);
                xw = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        } else {
            int e0[4], e1[4], e2[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int x = x0 + k;
                const bool in = x >= cx && x < cx + cw;
                e0[k] = in ? __ldg(maps + (x - cx)) : 0;
                e1[k] = in ? __ldg(maps + cw + (x - cx)) : 0;
                e2[k] = in ? __ldg(maps + 2 * cw + (x - cx)) : 0;
            }
            xi0 = make_int4(e0[0], e0[1], e0[2], e0[3]);
            xi1 = make_int4(e1[0], e1[1], e1[2], e1[3]);
            xw = make_float4(__int_as_float(e2[0]), __int_as_float(e2[1]), __int_as_float(e2[2]), __int_as_float(e2[3]));
        }
        const int xs0s[4] = {xi0.x, xi0.y, xi0.z, xi0.w};
        const int xs1s[4] = {xi1.x, xi1.y, xi1.z, xi1.w};
        const float wxs[4] = {xw.x, xw.y, xw.z, xw.w};

        if constexpr (!STAGED && enc_span(ENC)) {
            if (span_ok && x0 >= cx && x0 + 4 <= cx + cw && x0 + 4 <= W) {
                const int stride = xs0s[1] - xs0s[0];
                if (stride == 2 && span_pattern<2>(xs0s, xs1s)) {
                    span_group<ENC, 2>(p, dst, r0.base, r1.base, xs0s[0], wxs, wy, swap, x0, y);
                    continue;
                }
                if (stride == 3 && span_pattern<3>(xs0s, xs1s)) {
                    span_group<ENC, 3>(p, dst, r0.base, r1.base, xs0s[0], wxs, wy, swap, x0, y);
                    continue;
                }
            }
        }
        float v[4][3];
        float out[4][3];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int x = x0 + k;
            if (!row_in || x < cx || x >= cx + cw || x >= W) {
                out[k][0] = p.pad[0];
                out[k][1] = p.pad[1];
                out[k][2] = p.pad[2];
                continue;
            }
            if (nearest) {
                tap<ENC>(p, src, r0, xs0s[k], yr0, grey, v[k]);
            } else {
                float s00[3], s01[3], s10[3], s11[3];
                tap<ENC>(p, src, r0, xs0s[k], yr0, grey, s00);
                tap<ENC>(p, src, r0, xs1s[k], yr0, grey, s01);
                tap<ENC>(p, src, r1, xs0s[k], yr1, grey, s10);
                tap<ENC>(p, src, r1, xs1s[k], yr1, grey, s11);
#pragma unroll
                for (int c = 0; c < 3; ++c) {
                    v[k][c] = lerp_rn(lerp_rn(s00[c], s01[c], wxs[k]), lerp_rn(s10[c], s11[c], wxs[k]), wy);
                }
            }
            // channel order by selects (no runtime array index: that would go to local memory)
            const float c0 = grey ? v[k][0] : (swap ? v[k][2] : v[k][0]);
            const float c1 = grey ? v[k][0] : v[k][1];
            const float c2 = grey ? v[k][0] : (swap ? v[k][0] : v[k][2]);
            out[k][0] = __fadd_rn(__fmul_rn(c0, p.scale[0]), p.bias[0]);
            out[k][1] = __fadd_rn(__fmul_rn(c1, p.scale[1]), p.bias[1]);
            out[k][2] = __fadd_rn(__fmul_rn(c2, p.scale[2]), p.bias[2]);
        }
        store_group(p, dst, x0, y, out);
    }
}

template <u32 ENC>
__device__ __forceinline__ void resize_normalize(const PreprocessParams& p,
                                                 const u8* __restrict__ src,
                                                 const int* __restrict__ maps,
                                                 void* __restrict__ dst, u32 row_words) {
    extern __shared__ u32 rn_smem[];
    // The tile's x table: i0 | i1 | w1 (bits), RN_TILE_W entries each, 0 outside content.
    __shared__ __align__(16) int s_xtab[3 * RN_TILE_W];
    const int cx = p.content_x, cw = p.content_w, cy = p.content_y, chh = p.content_h;
    const int tid = threadIdx.y * RN_BLOCK_X + threadIdx.x;
    // Persistent blocks: the grid holds at most as many blocks as fit on the GPU at once
    // and each loops over tiles (row-major), so no partial last wave of blocks idles SMs.
    const int tiles_x = (p.dst_width + RN_TILE_W - 1) / RN_TILE_W;
    const int tiles = tiles_x * ((p.dst_height + RN_TILE_H - 1) / RN_TILE_H);
    bool staged = false;
    if constexpr (RN_STAGED && enc_is_packed(ENC)) staged = row_words != 0;  // uniform
    if (!staged) {
        // Direct path: each thread reads its x table entries itself; no shared memory, no
        // barrier.
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int tile_x0 = (tile % tiles_x) * RN_TILE_W, tile_y0 = (tile / tiles_x) * RN_TILE_H;
            rn_pixels<ENC, false>(p, src, maps, dst, 0u, 0, nullptr, tile_x0, tile_y0);
        }
        return;
    }
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int tile_x0 = (tile % tiles_x) * RN_TILE_W, tile_y0 = (tile / tiles_x) * RN_TILE_H;
        for (int i = tid; i < RN_TILE_W; i += RN_THREADS) {
            const int x = tile_x0 + i;
            const bool in = x >= cx && x < cx + cw;
            s_xtab[i] = in ? maps[x - cx] : 0;
            s_xtab[RN_TILE_W + i] = in ? maps[cw + x - cx] : 0;
            s_xtab[2 * RN_TILE_W + i] = in ? maps[2 * cw + x - cx] : 0;
        }

        // Staged path: copy the tile's source window into shared memory (whole block).
        // Slot ty holds row y_i0[y], slot RN_TILE_H + ty row y_i1[y], for output row
        // y = tile_y0 + ty; the host makes row_words odd, so the two half-warps of a warp
        // (adjacent ty) read different banks.
        int ws = 0;
        if constexpr (RN_STAGED && enc_is_packed(ENC)) {
            if (row_words != 0) {  // uniform over the block
                const int lo = max(tile_x0, cx), hi = min(tile_x0 + RN_TILE_W, cx + cw) - 1;
                if (lo <= hi) {
                    ws = maps[lo - cx];
                    int we = maps[cw + hi - cx];
                    if constexpr (enc_is_yuv422(ENC)) {
                        ws &= ~1;
                        we |= 1;
                    }
                    constexpr int bpp = enc_bpp(ENC);
                    const int lane = tid & 31;
                    const int* y_i0 = maps + 3 * cw;
                    const int* y_i1 = y_i0 + chh;
                    for (int slot = tid >> 5; slot < 2 * RN_TILE_H; slot += RN_THREADS / 32) {
                        const int ty = slot % RN_TILE_H;
                        const int yy = tile_y0 + ty;
                        if (yy < cy || yy >= cy + chh) continue;
                        const int row = slot < RN_TILE_H ? y_i0[yy - cy] : y_i1[yy - cy];
                        const unsigned long long first =
                            (unsigned long long)row * p.src_step + (unsigned long long)ws * bpp;
                        const int shift = (int)(first & 3);
                        const int nwords = min((shift + (we - ws + 1) * bpp + 3) >> 2, (int)row_words);
                        const u32* words = (const u32*)src + (first >> 2);
                        u32* srow = rn_smem + slot * row_words;
                        for (int w = lane; w < nwords; w += 32) cp_async4(srow + w, words + w);
                    }
                }
                cp_async_wait_all();
            }
        }
        __syncthreads();
        bool done = false;
        if constexpr (RN_STAGED && enc_is_packed(ENC)) {
            if (row_words != 0) {
                rn_pixels<ENC, true>(p, src, maps, dst, row_words, ws, s_xtab, tile_x0, tile_y0);
                done = true;
            }
        }
        if (!done) rn_pixels<ENC, false>(p, src, maps, dst, row_words, ws, s_xtab, tile_x0, tile_y0);
        __syncthreads();  // the next tile overwrites s_xtab and the staged window
    }
}

#define RN_ENTRY(name, ENC)                                                               \
    extern "C" __global__ void __launch_bounds__(RN_THREADS, rn_min_blocks(ENC))          \
        resize_normalize_##name(const PreprocessParams p, const u8* __restrict__ src,     \
                                const int* __restrict__ maps, void* __restrict__ dst,     \
                                u32 row_words) {                                          \
        resize_normalize<ENC>(p, src, maps, dst, row_words);                              \
    }

// One entry point per encoding of the host's table: resize_normalize_<name>.
#define RN_ENTRY_OF(name, code, bpp, packed) RN_ENTRY(name, code)
VP_ENCODINGS(RN_ENTRY_OF)

// The batch: ONE launch for N slots, grid (persistent tiles, 1, N), z = slot. Each block
// reads its slot's row of the table (its operation, frame, tables and output, which may
// differ in size and encoding from slot to slot) into shared memory and runs the same
// per-encoding code as resize_normalize_<name>, chosen by the slot's encoding. A padded
// slot (stale camera) has an empty content rectangle: every pixel is pad[c], nothing is
// read. Direct path only (row_words 0).
// The slot of this block (blockIdx.z): its operation into shared memory (`s_p`), its
// frame, tables and output addresses.
__device__ __forceinline__ void rn_batch_slot(const BatchItemDesc* __restrict__ items,
                                              PreprocessParams& s_p, const u8*& src,
                                              const int*& maps, void*& dst) {
    const BatchItemDesc* it = items + blockIdx.z;
    const int tid = threadIdx.y * RN_BLOCK_X + threadIdx.x;
    constexpr int words = sizeof(PreprocessParams) / 4;
    if (tid < words) ((u32*)&s_p)[tid] = ((const u32*)&it->p)[tid];
    __syncthreads();
    src = (const u8*)it->src;
    maps = (const int*)it->maps;
    dst = (void*)it->dst;
    // Device addresses of global memory (or mapped host memory, also in the global
    // window): let the compiler use global loads and stores, not generic ones.
    __builtin_assume(__isGlobal(src));
    __builtin_assume(__isGlobal(maps));
    __builtin_assume(__isGlobal(dst));
}

#define RN_BATCH_CASE(name, code, bpp, packed) \
    case code:                                 \
        resize_normalize<code>(s_p, src, maps, dst, 0u); \
        break;
extern "C" __global__ void __launch_bounds__(RN_THREADS, RN_MIN_BLOCKS_SPAN)
    resize_normalize_batch(const BatchItemDesc* __restrict__ items) {
    __shared__ PreprocessParams s_p;
    const u8* src;
    const int* maps;
    void* dst;
    rn_batch_slot(items, s_p, src, maps, dst);
    switch (s_p.encoding) {
        VP_ENCODINGS(RN_BATCH_CASE)
        default:
            break;  // the host builds every slot with a code of the table
    }
}
