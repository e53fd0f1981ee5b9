//! Launch shapes of every kernel, as named constants and one helper per kernel, and
//! the `#[repr(C)]` structs the kernels read that are not operation structs (the conv2d
//! parameters, the batch's slot table). The kernels get the
//! constants from here as `-D` defines (`kernels::host_defines`).

use crate::backend::ops::{AxisMap, PreprocessParams};
use crate::config::{Border, DType, Layout};
use crate::image::Encoding;
use cudarc::driver::{DeviceRepr, LaunchConfig};

/// How the fused kernel reads packed encodings (rgb8 ... bgr16, yuyv, uyvy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedPath {
    /// Straight from global memory through L1 (the default: measured faster on the H200,
    /// docs/GPU.md).
    Direct,
    /// Through a shared-memory copy of each tile's source window (cp.async), when the
    /// window fits; compiled with `-DRN_STAGED=1`.
    Staged,
}

/// Output pixels per thread of the fused kernel (adjacent in a row; one 16-byte store
/// per channel for float32 NCHW). `RN_PX` in `resize_normalize.cu`.
pub(crate) const RN_PX: u32 = 4;
/// Fused kernel block width in threads (`RN_BLOCK_X`).
pub(crate) const RN_BLOCK_X: u32 = 16;
/// Fused kernel block height in threads (`RN_BLOCK_Y`): one output row per thread row.
pub(crate) const RN_BLOCK_Y: u32 = 16;
/// Output columns covered by one fused-kernel block.
pub(crate) const RN_TILE_W: u32 = RN_BLOCK_X * RN_PX;
/// Output rows covered by one fused-kernel block.
pub(crate) const RN_TILE_H: u32 = RN_BLOCK_Y;
/// Largest shared-memory window of the staged path; wider windows (downscales beyond
/// about 5x for rgb8) use the direct path. Below the 48 KiB that needs no opt-in, and
/// small enough for 6 blocks (1536 threads) per SM on the Orin's 164 KiB.
pub(crate) const STAGED_SMEM_MAX_BYTES: u32 = 24 * 1024;

/// conv2d tiled block width (`CV_BLOCK_X`): one output column per thread.
pub(crate) const CV_BLOCK_X: u32 = 32;
/// conv2d tiled block height (`CV_BLOCK_Y`).
pub(crate) const CV_BLOCK_Y: u32 = 8;
/// Output rows per thread of the tiled conv2d (`CV_ROWS`).
pub(crate) const CV_ROWS: u32 = 4;
/// Output tile of one tiled conv2d block: `CV_BLOCK_X` x `CV_BLOCK_Y * CV_ROWS`.
pub(crate) const CV_TILE: (u32, u32) = (CV_BLOCK_X, CV_BLOCK_Y * CV_ROWS);

/// conv2d settings passed by value. Keep in sync with `struct Conv2dParams` in
/// `kernels/common.cuh` (checked at every compilation).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Network image width.
    pub width: u32,
    /// Network image height.
    pub height: u32,
    /// Planes in the input (= output channels).
    pub channels: u32,
    /// Odd kernel side, 1..=15.
    pub size: u32,
    /// Border handling (`BORDER_*`).
    pub border: Border,
    /// Layout of the output (`LAYOUT_*`).
    pub layout: Layout,
    /// Element type of the output (`DTYPE_*`).
    pub dtype: DType,
    /// Batch slots (grid z) the launch leaves alone: bit z set = a padded slot, not
    /// convolved (0 for a single frame).
    pub skip: u32,
}

/// Most slots of one batched launch: one bit each in [`Conv2dParams::skip`]. The
/// configuration's input limit fits (checked when this compiles), so a batch of the node
/// always does; a larger hand-made batch is refused as an operation error.
pub const MAX_BATCH_SLOTS: usize = u32::BITS as usize;
const _: () = assert!(crate::config::MAX_INPUTS <= MAX_BATCH_SLOTS);

/// One slot of a batched fused launch, one row of the device table.
/// Keep in sync with `struct BatchItemDesc` in `kernels/common.cuh` (checked at every
/// compilation: kernels.rs `layout_defines`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchItemDesc {
    /// The slot's operation (a padded slot: empty content rectangle).
    pub p: PreprocessParams,
    /// 0 (aligns the addresses to 8 bytes).
    pub reserved: u32,
    /// Device address of the frame (0 for a padded slot).
    pub src: u64,
    /// Device address of its sampling tables (0 for a padded slot).
    pub maps: u64,
    /// Device address of this slot's output.
    pub dst: u64,
}

impl BatchItemDesc {
    /// The table's bytes, as the kernel reads them.
    pub(crate) fn as_bytes(rows: &[BatchItemDesc]) -> &[u8] {
        // SAFETY: BatchItemDesc is plain #[repr(C)] data without padding (see its
        // DeviceRepr note), so its bytes may be viewed as u8 for as long as `rows` lives.
        unsafe { std::slice::from_raw_parts(rows.as_ptr().cast(), std::mem::size_of_val(rows)) }
    }
}

// SAFETY: #[repr(C)], only 4-byte fields (u32, f32, and #[repr(u32)] enums whose
// discriminants are the kernels' codes; no padding, no pointers), and the C twin's size
// and offsets are checked by static_assert at every compilation (kernels.rs
// layout_defines), so the bytes mean the same on both sides.
unsafe impl DeviceRepr for PreprocessParams {}
// SAFETY: as above: #[repr(C)], eight 4-byte u32 / #[repr(u32)] fields, layout checked
// against the C twin.
unsafe impl DeviceRepr for Conv2dParams {}
// SAFETY: #[repr(C)] of 4-byte fields, one u32 and three u64 (no implicit padding: 100 +
// 4 bytes before the first u64), with the C twin's size and offsets checked by
// static_assert at every compilation.
unsafe impl DeviceRepr for BatchItemDesc {}

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32), smem: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: grid, block_dim: block, shared_mem_bytes: smem }
}

/// Tiles of the fused kernel for `p`: `ceil(W / 64) * ceil(H / 16)`.
pub(crate) fn resize_normalize_tiles(p: &PreprocessParams) -> u32 {
    p.dst_width.div_ceil(RN_TILE_W) * p.dst_height.div_ceil(RN_TILE_H)
}

/// Launch shape of `resize_normalize_*` for `p`, with `row_words` 32-bit words per
/// staged row (0: direct path, no shared memory): a 1-D grid of persistent blocks, one per
/// tile but at most `resident` (the blocks that fit on the GPU at once; each block loops
/// over the tiles, so there is no partial last wave).
pub fn resize_normalize_cfg(p: &PreprocessParams, row_words: u32, resident: u32) -> LaunchConfig {
    cfg(
        (resize_normalize_tiles(p).min(resident).max(1), 1, 1),
        (RN_BLOCK_X, RN_BLOCK_Y, 1),
        staged_smem_bytes(row_words),
    )
}

/// Shared memory of the staged path: two source rows per output row of the tile.
pub(crate) fn staged_smem_bytes(row_words: u32) -> u32 {
    2 * RN_TILE_H * row_words * 4
}

/// Words per staged row for this operation (the widest source window of any tile, with
/// room for a 3-byte misalignment), or 0 when the direct path must be used (encoding
/// not packed, or the window does not fit in `STAGED_SMEM_MAX_BYTES`).
/// Mirrors the window computation at the top of `resize_normalize` in the kernel.
pub fn staged_row_words(p: &PreprocessParams, x_map: &AxisMap, enc: Encoding) -> u32 {
    if !enc.is_packed() || x_map.i0.is_empty() {
        return 0;
    }
    let yuv = matches!(enc, Encoding::Yuyv | Encoding::Uyvy);
    let bpp = enc.bytes_per_pixel();
    let (cx, cw) = (p.content_x, p.content_w);
    let mut max_span = 0u32;
    let mut tile_x0 = 0u32;
    while tile_x0 < p.dst_width {
        let lo = tile_x0.max(cx);
        let hi = (tile_x0 + RN_TILE_W).min(cx + cw);
        if lo < hi {
            let mut ws = x_map.i0[(lo - cx) as usize];
            let mut we = x_map.i1[(hi - 1 - cx) as usize];
            if yuv {
                ws &= !1;
                we |= 1;
            }
            max_span = max_span.max((we - ws + 1).max(0) as u32);
        }
        tile_x0 += RN_TILE_W;
    }
    // Odd, so the rows of adjacent output rows (adjacent slots) start in different banks.
    let words = (3 + max_span * bpp).div_ceil(4) | 1;
    if staged_smem_bytes(words) > STAGED_SMEM_MAX_BYTES {
        0
    } else {
        words
    }
}

/// Launch shape of `conv2d_tiled_k*` / `conv2d_separable_k*` on a `w` x `h` image.
pub fn conv_tiled_cfg(w: u32, h: u32) -> LaunchConfig {
    conv_tiled_batch_cfg(w, h, 1)
}

/// [`conv_tiled_cfg`] for a batch of `n` slots: grid z = slot.
pub(crate) fn conv_tiled_batch_cfg(w: u32, h: u32, n: u32) -> LaunchConfig {
    cfg((w.div_ceil(CV_TILE.0), h.div_ceil(CV_TILE.1), n), (CV_BLOCK_X, CV_BLOCK_Y, 1), 0)
}

/// Launch shape of `resize_normalize_batch` for `n` slots of `tiles` tiles each (the
/// network size is the same for every slot): grid (persistent tiles, 1, n), the
/// persistent blocks of all slots together at most `resident`.
pub(crate) fn resize_normalize_batch_cfg(tiles: u32, n: u32, resident: u32) -> LaunchConfig {
    let per_slot = (resident / n.max(1)).clamp(1, tiles.max(1));
    cfg((per_slot, 1, n.max(1)), (RN_BLOCK_X, RN_BLOCK_Y, 1), 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Interpolation;

    fn params(dst_w: u32, cx: u32, cw: u32) -> PreprocessParams {
        PreprocessParams {
            src_width: 0,
            src_height: 0,
            src_step: 0,
            encoding: 0,
            big_endian: 0,
            dst_width: dst_w,
            dst_height: 4,
            content_x: cx,
            content_y: 0,
            content_w: cw,
            content_h: 4,
            channels: 3,
            swap_rb: 0,
            layout: Layout::Nchw,
            dtype: DType::Float32,
            interpolation: Interpolation::Linear,
            scale: [1.0; 3],
            bias: [0.0; 3],
            pad: [0.0; 3],
        }
    }

    #[test]
    fn staged_window_of_a_2x_downscale() {
        // 3840 -> 1920 linear: f = (d + 0.5) * 2 - 0.5 = 2d + 0.5, so i0 = 2d, i1 = 2d + 1;
        // the tile d = 64t..64t+63 samples columns 128t..128t+127: 128 px = 384 B, plus 3
        // bytes of misalignment -> 97 words.
        let m = AxisMap::new(0, 3840, 1920, Interpolation::Linear);
        let p = params(1920, 0, 1920);
        let words = staged_row_words(&p, &m, Encoding::Rgb8);
        assert_eq!(words, 97, "ceil((3 + 384) / 4) = 97, already odd");
        assert_eq!(staged_smem_bytes(words), 2 * 16 * 97 * 4);
        // 3x: f = 3d + 1, so a tile samples 3*64t+1 ..= 3*64t+191: 191 px = 573 B + 3 =
        // 576 B = 144 words, bumped to 145 (odd: adjacent slots start in other banks).
        let m3 = AxisMap::new(0, 1536, 512, Interpolation::Linear);
        assert_eq!(staged_row_words(&params(512, 0, 512), &m3, Encoding::Rgb8), 145);
        // 4x: 255 px = 765 B + 3 -> 192 | 1 = 193 words = 24.7 KiB > 24 KiB: direct path.
        let m4 = AxisMap::new(0, 2048, 512, Interpolation::Linear);
        assert_eq!(staged_row_words(&params(512, 0, 512), &m4, Encoding::Rgb8), 0);
        assert_eq!(staged_row_words(&p, &m, Encoding::Nv12), 0, "nv12 is not packed");
    }

    #[test]
    fn staged_window_falls_back_when_too_wide() {
        // 8x downscale of rgb16: 512 px * 6 B per tile row = 3 KiB a row, 32 rows > 24 KiB
        let m = AxisMap::new(0, 4096, 512, Interpolation::Linear);
        let p = params(512, 0, 512);
        assert_eq!(staged_row_words(&p, &m, Encoding::Rgb16), 0);
    }

    #[test]
    fn launch_shapes_cover_the_image() {
        let p = params(641, 0, 641);
        // 641 x 4: 11 x 1 tiles; capped by the resident blocks
        let c = resize_normalize_cfg(&p, 0, 1000);
        assert_eq!(c.grid_dim, (11, 1, 1));
        assert_eq!(resize_normalize_cfg(&p, 0, 4).grid_dim, (4, 1, 1));
        let mut big = p;
        big.dst_height = 1080;
        big.dst_width = 1920;
        assert_eq!(resize_normalize_tiles(&big), 30 * 68);
        assert_eq!(c.block_dim, (16, 16, 1));
        assert_eq!(conv_tiled_cfg(1920, 1080).grid_dim, (60, 34, 1));
    }
}
