// baselines.cu: kernels kept for `vision_preproc bench` ONLY (the node never loads this
// file). They are the straightforward versions the fused and tiled kernels replace, so
// the benchmark can measure what fusion and tiling buy.
//
// Three-kernel path (the Orin reference measurement in docs/GPU.md):
//   baseline_resize_rgb8        src: (H, W, 3) u8 rows of src_step bytes -> (H', W', 3)
//                               u8 dense, bilinear through the same host tables as the
//                               fused kernel (rounded to nearest), 0 outside the content
//                               rectangle. One thread per output pixel; block 256,
//                               grid ceil(H'W' / 256).
//   baseline_normalize_hwc      (H', W', 3) u8 -> (H', W', 3) f32, v*scale[c] + bias[c].
//                               One thread per element; block 256.
//   baseline_hwc_to_chw         (H', W', 3) f32 -> (3, H', W') f32. One thread per output
//                               element; block 256.
// Naive conv2d:
//   conv2d_naive                src (C, H, W) f32 -> dst in the Conv2dParams layout and
//                               dtype; one thread per output element, every tap read
//                               from global memory (through L1), weights in
//                               c_naive_w (__constant__). Block (32, 8), grid
//                               (ceil(W/32), ceil(H/8), C). Same reference as
//                               conv2d_tiled.cu (cv2.filter2D, OpenCV borders).
// Clock probe:
//   measure_clock               one thread spins for `cycles` SM clocks (clock64) and
//                               writes the count it saw; the host times it with events
//                               to read the SM clock during the benchmark.
#include "common.cuh"

__constant__ float c_naive_w[VP_MAX_CONV * VP_MAX_CONV];

extern "C" __global__ void baseline_resize_rgb8(const PreprocessParams p, const u8* __restrict__ src,
                                                const int* __restrict__ maps, u8* __restrict__ dst) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 W = p.dst_width, H = p.dst_height;
    if (i >= W * H) return;
    const int x = i % W, y = i / W;
    const int cx = p.content_x, cy = p.content_y, cw = p.content_w, ch = p.content_h;
    u8* o = dst + (unsigned long long)i * 3;
    if (x < cx || x >= cx + cw || y < cy || y >= cy + ch) {
        o[0] = o[1] = o[2] = 0;
        return;
    }
    const int* x_i0 = maps;
    const int* x_i1 = maps + cw;
    const float* x_w1 = (const float*)(maps + 2 * cw);
    const int* y_i0 = maps + 3 * cw;
    const int* y_i1 = y_i0 + ch;
    const float* y_w1 = (const float*)(y_i1 + ch);
    const int xs0 = x_i0[x - cx], xs1 = x_i1[x - cx], ys0 = y_i0[y - cy], ys1 = y_i1[y - cy];
    const float wx = x_w1[x - cx], wy = y_w1[y - cy];
    const u8* r0 = src + (unsigned long long)ys0 * p.src_step;
    const u8* r1 = src + (unsigned long long)ys1 * p.src_step;
    for (int c = 0; c < 3; ++c) {
        const float top = r0[xs0 * 3 + c] * (1.0f - wx) + r0[xs1 * 3 + c] * wx;
        const float bot = r1[xs0 * 3 + c] * (1.0f - wx) + r1[xs1 * 3 + c] * wx;
        o[c] = (u8)__float2int_rn(top * (1.0f - wy) + bot * wy);
    }
}

extern "C" __global__ void baseline_normalize_hwc(const PreprocessParams p, const u8* __restrict__ src,
                                                  float* __restrict__ dst) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.dst_width * p.dst_height * 3) return;
    const u32 c = i % 3;
    dst[i] = src[i] * p.scale[c] + p.bias[c];
}

extern "C" __global__ void baseline_hwc_to_chw(const PreprocessParams p, const float* __restrict__ src,
                                               float* __restrict__ dst) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 W = p.dst_width, H = p.dst_height;
    if (i >= W * H * 3) return;
    const u32 c = i / (W * H), r = i % (W * H);
    dst[i] = src[r * 3 + c];
}

extern "C" __global__ void conv2d_naive(const Conv2dParams p, const float* __restrict__ src,
                                        void* __restrict__ dst) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    const u32 c = blockIdx.z;
    const int W = p.width, H = p.height, K = p.size, R = K / 2;
    if (x >= W || y >= H) return;
    const float* plane = src + (unsigned long long)c * W * H;
    float acc = 0.0f;
    for (int ky = 0; ky < K; ++ky) {
        const int gy = border_index(y + ky - R, H, p.border);
        for (int kx = 0; kx < K; ++kx) {
            const int gx = border_index(x + kx - R, W, p.border);
            const float v = (gx < 0 || gy < 0) ? 0.0f : plane[(unsigned long long)gy * W + gx];
            acc = fmaf(c_naive_w[ky * K + kx], v, acc);
        }
    }
    store_elem(dst, p.dtype, tensor_index(p.layout, p.channels, H, W, c, y, x), acc);
}

extern "C" __global__ void measure_clock(unsigned long long cycles, unsigned long long* out) {
    const unsigned long long start = clock64();
    unsigned long long now = start;
    while (now - start < cycles) now = clock64();
    out[0] = now - start;
}
