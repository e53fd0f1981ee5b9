// conv2d_tiled.cu: conv2d (correlation, like cv2.filter2D) of each channel of the
// normalized network image, through a shared-memory tile with halo.
//
// Layouts
//   src  float32 (C, H, W) planar, dense: the fused kernel's output when conv is on.
//   dst  the final tensor: (C, H, W) or (H, W, C), float32 or float16 bits, dense.
//   Weights in __constant__ memory, set by the host before the launch:
//   c_conv_w[ky * K + kx] (row-major, K x K) for the 2-D path; for the separable path
//   c_conv_col[kx] (factor along x) and c_conv_row[ky] (factor along y), where
//   w[ky][kx] = row[ky] * col[kx].
// Launch shape
//   block (CV_BLOCK_X, CV_BLOCK_Y) = (32, 8); each thread computes CV_ROWS = 4 outputs
//   of one column, so a block covers a 32 x 32 tile; grid (ceil(W / 32), ceil(H / 32), N):
//   z = batch slot (1 for a single frame), slot z at src + z*C*H*W and dst + z*C*H*W
//   elements; a slot whose bit is set in p.skip (a padded batch slot) is left alone.
//   The block loops over the channels, reloading the (32 + K - 1)^2 tile for each. K is
//   a template parameter (odd 1..15): one entry point per size, conv2d_tiled_k<K> and
//   conv2d_separable_k<K>. Static shared memory only.
// Reference behaviour: src/backend/cpu conv (= cv2.filter2D per channel, anchor at the
//   centre, delta 0): out(y, x) = sum_ky sum_kx w[ky][kx] * in(y + ky - K/2, x + kx - K/2),
//   borders BORDER_REPLICATE / BORDER_CONSTANT (0) / BORDER_REFLECT_101 as in
//   cv::borderInterpolate; float16 rounding (nearest even) after the sum.
//   Each thread keeps its 4 accumulators in registers and reads each tile row once
//   (K + 3 rows of K values for 4 outputs instead of 4 K^2): taps come from shared
//   memory, never from global memory twice.
#include "common.cuh"

// CV_BLOCK_X, CV_BLOCK_Y, CV_ROWS come from the host (src/backend/cuda/launch.rs).
#define CV_THREADS (CV_BLOCK_X * CV_BLOCK_Y)
#define CV_TILE_W CV_BLOCK_X
#define CV_TILE_H (CV_BLOCK_Y * CV_ROWS)

__constant__ float c_conv_w[VP_MAX_CONV * VP_MAX_CONV];
__constant__ float c_conv_col[VP_MAX_CONV];
__constant__ float c_conv_row[VP_MAX_CONV];

template <int K, bool SEP>
__device__ __forceinline__ void conv2d_tiled(const Conv2dParams& p, const float* __restrict__ src,
                                             void* __restrict__ dst) {
    constexpr int R = K / 2;
    constexpr int SW = CV_TILE_W + 2 * R;
    constexpr int SH = CV_TILE_H + 2 * R;
    __shared__ float tile[SH][SW];
    __shared__ float hsum[SEP ? SH : 1][CV_TILE_W];
    const int W = p.width, H = p.height;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tid = ty * CV_BLOCK_X + tx;
    const int bx0 = blockIdx.x * CV_TILE_W, by0 = blockIdx.y * CV_TILE_H;
    const int ox = bx0 + tx;
    const int oy0 = by0 + ty * CV_ROWS;
    if (blockIdx.z < 32 && (p.skip >> blockIdx.z) & 1u) return;  // uniform over the block
    const unsigned long long slot = (unsigned long long)blockIdx.z * p.channels * W * H;
    src += slot;
    dst = p.dtype == DTYPE_F16 ? (void*)((u16*)dst + slot) : (void*)((float*)dst + slot);

    for (u32 c = 0; c < p.channels; ++c) {
        const float* plane = src + (unsigned long long)c * W * H;
        for (int i = tid; i < SH * SW; i += CV_THREADS) {
            const int sy = i / SW, sx = i - sy * SW;
            const int gy = border_index(by0 + sy - R, H, p.border);
            const int gx = border_index(bx0 + sx - R, W, p.border);
            tile[sy][sx] = (gx < 0 || gy < 0) ? 0.0f : plane[(unsigned long long)gy * W + gx];
        }
        __syncthreads();

        float acc[CV_ROWS];
#pragma unroll
        for (int j = 0; j < CV_ROWS; ++j) acc[j] = 0.0f;
        if constexpr (SEP) {
            for (int sy = ty; sy < SH; sy += CV_BLOCK_Y) {
                float s = 0.0f;
#pragma unroll
                for (int kx = 0; kx < K; ++kx) s = fmaf(c_conv_col[kx], tile[sy][tx + kx], s);
                hsum[sy][tx] = s;
            }
            __syncthreads();
#pragma unroll
            for (int r = 0; r < CV_ROWS + K - 1; ++r) {
                const float v = hsum[ty * CV_ROWS + r][tx];
#pragma unroll
                for (int j = 0; j < CV_ROWS; ++j) {
                    const int ky = r - j;
                    if (ky >= 0 && ky < K) acc[j] = fmaf(c_conv_row[ky], v, acc[j]);
                }
            }
        } else {
#pragma unroll
            for (int r = 0; r < CV_ROWS + K - 1; ++r) {
                float v[K];
#pragma unroll
                for (int kx = 0; kx < K; ++kx) v[kx] = tile[ty * CV_ROWS + r][tx + kx];
#pragma unroll
                for (int j = 0; j < CV_ROWS; ++j) {
                    const int ky = r - j;
                    if (ky >= 0 && ky < K) {
#pragma unroll
                        for (int kx = 0; kx < K; ++kx) {
                            acc[j] = fmaf(c_conv_w[ky * K + kx], v[kx], acc[j]);
                        }
                    }
                }
            }
        }

        if (ox < W) {
#pragma unroll
            for (int j = 0; j < CV_ROWS; ++j) {
                const int oy = oy0 + j;
                if (oy < H) {
                    store_elem(dst, p.dtype, tensor_index(p.layout, p.channels, H, W, c, oy, ox), acc[j]);
                }
            }
        }
        __syncthreads();  // the next channel overwrites the tile
    }
}

#define CV_ENTRY(K)                                                                          \
    extern "C" __global__ void __launch_bounds__(CV_THREADS)                                 \
        conv2d_tiled_k##K(const Conv2dParams p, const float* __restrict__ src,               \
                          void* __restrict__ dst) {                                          \
        conv2d_tiled<K, false>(p, src, dst);                                                 \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(CV_THREADS)                                 \
        conv2d_separable_k##K(const Conv2dParams p, const float* __restrict__ src,           \
                              void* __restrict__ dst) {                                      \
        conv2d_tiled<K, true>(p, src, dst);                                                  \
    }

// One pair of entry points per conv2d size of the host (VP_CONV_SIZES: odd 1..=VP_MAX_CONV).
VP_CONV_SIZES(CV_ENTRY)
