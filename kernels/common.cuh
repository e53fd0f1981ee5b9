// common.cuh: what every vision_preproc kernel shares. The by-value parameter structs
// (C twins of #[repr(C)] Rust structs, checked field by field at every compilation), the
// codes of encodings, layouts, dtypes and borders, OpenCV's border rule, and the stores.
//
// No standard header is included: NVRTC compiles these files with no CUDA toolkit
// installed (the Jetson and the CI machine have only libnvrtc).
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

// Defined by the host, from the Rust enums and constants (src/backend/cuda/kernels.rs,
// host_defines), so there is no second list here to keep in sync:
//   ENC_<NAME>                 the codes of src/image.rs `Encoding` (ENC_RGB8 = 0, ...)
//   VP_ENCODINGS(X)            X(name, ENC_<NAME>, bytes per pixel, packed 0/1) per encoding
//   LAYOUT_*, DTYPE_*, INTERP_*, BORDER_*   the codes of src/config.rs Layout, DType,
//                              Interpolation, Border
//   VP_MAX_CONV, VP_CONV_SIZES(X)   the largest conv2d side (config::MAX_CONV_SIZE) and
//                              X(k) per odd size 1..=VP_MAX_CONV
//   RN_PX, RN_BLOCK_X, RN_BLOCK_Y, CV_BLOCK_X, CV_BLOCK_Y, CV_ROWS   launch shapes
//                              (src/backend/cuda/launch.rs)
#if !defined(VP_ENCODINGS) || !defined(VP_CONV_SIZES) || !defined(DTYPE_F16) || !defined(RN_PX)
#error "compile with the host's defines (src/backend/cuda/kernels.rs compile_options)"
#endif

// keep in sync with src/backend/ops.rs (struct PreprocessParams)
struct PreprocessParams {
    u32 src_width;
    u32 src_height;
    u32 src_step;
    u32 encoding;
    u32 big_endian;
    u32 dst_width;
    u32 dst_height;
    u32 content_x;
    u32 content_y;
    u32 content_w;
    u32 content_h;
    u32 channels;
    u32 swap_rb;
    u32 layout;
    u32 dtype;
    u32 interpolation;
    float scale[3];
    float bias[3];
    float pad[3];
};

// keep in sync with src/backend/cuda/launch.rs (struct Conv2dParams)
struct Conv2dParams {
    u32 width;     // network image width
    u32 height;    // network image height
    u32 channels;  // planes in the input
    u32 size;      // odd kernel side
    u32 border;    // BORDER_*
    u32 layout;    // LAYOUT_* of the output
    u32 dtype;     // DTYPE_* of the output
    u32 skip;      // batch slots (grid z) left alone: bit z set = padded slot, not convolved
};

// One slot of a batched fused launch (grid z = slot), read from a small device table.
// keep in sync with src/backend/cuda/launch.rs (struct BatchItemDesc)
struct BatchItemDesc {
    PreprocessParams p;     // this slot's operation (a padded slot: empty content rectangle)
    u32 reserved;           // 0 (aligns the addresses)
    unsigned long long src;   // device address of the frame (0 for a padded slot)
    unsigned long long maps;  // device address of its sampling tables (0 for a padded slot)
    unsigned long long dst;   // device address of this slot's output
};

// The host compiles with -DVP_LAYOUT_CHECK and one -DVP_OFF_<Struct>_<field>=<offset>
// per field, computed with std::mem::offset_of! on the Rust structs: a field moved,
// added or retyped on one side only fails the build here, at start-up and in CI.
#ifdef VP_LAYOUT_CHECK
#ifdef __CUDACC_RTC__
// NVRTC has no offsetof in constant expressions; EDG's __INTADDR__ folds this one.
#define VP_OFFSETOF(S, f) __INTADDR__(&((S*)0)->f)
#else
#define VP_OFFSETOF(S, f) __builtin_offsetof(S, f)
#endif
#define VP_CHECK_FIELD(S, f)                                          \
    static_assert(VP_OFFSETOF(S, f) == VP_OFF_##S##_##f,              \
                  #S "." #f ": offset differs from the Rust struct")
#define VP_CHECK_SIZE(S) \
    static_assert(sizeof(S) == VP_SIZE_##S, #S ": size differs from the Rust struct")
VP_CHECK_SIZE(PreprocessParams);
VP_CHECK_FIELD(PreprocessParams, src_width);
VP_CHECK_FIELD(PreprocessParams, src_height);
VP_CHECK_FIELD(PreprocessParams, src_step);
VP_CHECK_FIELD(PreprocessParams, encoding);
VP_CHECK_FIELD(PreprocessParams, big_endian);
VP_CHECK_FIELD(PreprocessParams, dst_width);
VP_CHECK_FIELD(PreprocessParams, dst_height);
VP_CHECK_FIELD(PreprocessParams, content_x);
VP_CHECK_FIELD(PreprocessParams, content_y);
VP_CHECK_FIELD(PreprocessParams, content_w);
VP_CHECK_FIELD(PreprocessParams, content_h);
VP_CHECK_FIELD(PreprocessParams, channels);
VP_CHECK_FIELD(PreprocessParams, swap_rb);
VP_CHECK_FIELD(PreprocessParams, layout);
VP_CHECK_FIELD(PreprocessParams, dtype);
VP_CHECK_FIELD(PreprocessParams, interpolation);
VP_CHECK_FIELD(PreprocessParams, scale);
VP_CHECK_FIELD(PreprocessParams, bias);
VP_CHECK_FIELD(PreprocessParams, pad);
VP_CHECK_SIZE(Conv2dParams);
VP_CHECK_FIELD(Conv2dParams, width);
VP_CHECK_FIELD(Conv2dParams, height);
VP_CHECK_FIELD(Conv2dParams, channels);
VP_CHECK_FIELD(Conv2dParams, size);
VP_CHECK_FIELD(Conv2dParams, border);
VP_CHECK_FIELD(Conv2dParams, layout);
VP_CHECK_FIELD(Conv2dParams, dtype);
VP_CHECK_FIELD(Conv2dParams, skip);
VP_CHECK_SIZE(BatchItemDesc);
VP_CHECK_FIELD(BatchItemDesc, p);
VP_CHECK_FIELD(BatchItemDesc, reserved);
VP_CHECK_FIELD(BatchItemDesc, src);
VP_CHECK_FIELD(BatchItemDesc, maps);
VP_CHECK_FIELD(BatchItemDesc, dst);
#endif

// f32 -> IEEE binary16 bits, round to nearest even (= half::f16::from_f32 on the CPU).
__device__ __forceinline__ u16 f32_to_f16_bits(float v) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

// OpenCV's cv::borderInterpolate for the three borders we support: the source index
// for p in a line of len samples, or -1 for BORDER_CONSTANT outside (value 0).
__device__ __forceinline__ int border_index(int p, int len, u32 border) {
    if ((unsigned)p < (unsigned)len) return p;
    if (border == BORDER_REPLICATE) return p < 0 ? 0 : len - 1;
    if (border == BORDER_CONSTANT) return -1;
    // BORDER_REFLECT_101: gfedcb|abcdefgh|gfedcba
    if (len == 1) return 0;
    do {
        p = p < 0 ? -p : 2 * len - p - 2;
    } while ((unsigned)p >= (unsigned)len);
    return p;
}

// Element index of (c, y, x) in a dense tensor of the given layout.
__device__ __forceinline__ unsigned long long tensor_index(u32 layout, u32 channels, u32 height,
                                                           u32 width, u32 c, u32 y, u32 x) {
    return layout == LAYOUT_NCHW
               ? ((unsigned long long)c * height + y) * width + x
               : ((unsigned long long)y * width + x) * channels + c;
}

// Store one element of dtype at element index i.
__device__ __forceinline__ void store_elem(void* dst, u32 dtype, unsigned long long i, float v) {
    if (dtype == DTYPE_F16) {
        ((u16*)dst)[i] = f32_to_f16_bits(v);
    } else {
        ((float*)dst)[i] = v;
    }
}
