// klab_variants.cu: the code of the kernel lab's variants that the shipped kernel
// (kernels/resize_normalize.cu) does not hold, one section per patch of
// klab_variants.py, each opened by a line `// @@ NAME`. The patch puts its section where
// it says, so the code uses the names the shipped kernel has at that place.

// @@ prefetch
#if __CUDA_ARCH__ >= 900
            if constexpr (enc_is_packed(ENC) && !enc_is_yuv422(ENC)) {
                // Warp 0 asks L2 (cp.async.bulk.prefetch, sm_90) for the source rows of
                // this block's next tile, so that its loads find them there: one bulk
                // prefetch per source row.
                const int next = tile + gridDim.x;
                if (tid < 2 * RN_TILE_H && next < tiles) {
                    const int nx0 = (next % tiles_x) * RN_TILE_W, ny = (next / tiles_x) * RN_TILE_H + (tid & (RN_TILE_H - 1));
                    const int lo = max(nx0, cx), hi = min(nx0 + RN_TILE_W, cx + cw) - 1;
                    if (lo <= hi && ny >= cy && ny < cy + chh) {
                        const int* yt = maps + 3 * cw + (tid >= RN_TILE_H ? chh : 0);
                        const int row = __ldg(yt + (ny - cy));
                        const int c0 = __ldg(maps + (lo - cx)), c1 = __ldg(maps + cw + (hi - cx));
                        constexpr int bpp = enc_bpp(ENC);
                        const unsigned long long a = (unsigned long long)src + (unsigned long long)row * p.src_step + (unsigned long long)c0 * bpp;
                        const unsigned long long b = (unsigned long long)src + (unsigned long long)row * p.src_step + (unsigned long long)(c1 + 1) * bpp;
                        const unsigned long long a16 = a & ~15ull, b16 = (b + 15) & ~15ull;
                        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a16), "r"((u32)(b16 - a16)) : "memory");
                    }
                }
            }
#endif

// @@ batch_enc
// The batch when every slot has one encoding: the same launch, with only that
// encoding's code (resize_normalize_batch_<name>), so its registers are allocated for it
// alone, as resize_normalize_<name>'s are. A padded slot (empty content rectangle: only
// pad values, nothing read) runs through it whatever its encoding.
#define RN_BATCH_ENTRY(name, code, bpp, packed)                                           \
    extern "C" __global__ void __launch_bounds__(RN_THREADS, rn_min_blocks(code))         \
        resize_normalize_batch_##name(const BatchItemDesc* __restrict__ items) {          \
        __shared__ PreprocessParams s_p;                                                  \
        const u8* src;                                                                    \
        const int* maps;                                                                  \
        void* dst;                                                                        \
        rn_batch_slot(items, s_p, src, maps, dst);                                        \
        if (s_p.encoding == code || s_p.content_w == 0 || s_p.content_h == 0)             \
            resize_normalize<code>(s_p, src, maps, dst, 0u);                              \
    }
VP_ENCODINGS(RN_BATCH_ENTRY)
