//! The specification, one output element at a time: what every backend computes for
//! element (c, y, x) of the tensor. This is the loop a CUDA thread runs (one thread per
//! output element); the fast CPU pass in the parent module computes the same values in
//! the same floating-point order, bit for bit (tested).
//!
//! ```text
//! if (x, y) outside the content rectangle:   v = pad[c]                  (normalized)
//! else:
//!   dx = x - content_x, dy = y - content_y
//!   (x0, x1, wx) = x_map[dx], (y0, y1, wy) = y_map[dy]
//!   s(u, v) = decoded source sample of output channel c at (u, v), in 8-bit units:
//!             channels 1: grey(u, v); channels 3: rgb(u, v)[c], or [2 - c] for bgr
//!   top = s(x0, y0) * (1 - wx) + s(x1, y0) * wx                         (f32)
//!   bot = s(x0, y1) * (1 - wx) + s(x1, y1) * wx
//!   v   = (top * (1 - wy) + bot * wy) * scale[c] + bias[c]
//! stored as f32, or f16 rounded to nearest even, at desc.index(c, y, x), little-endian
//! ```

use super::decode::{pixel_grey, pixel_rgb};
use crate::backend::{write_element, PreprocessOp};
use crate::error::Result;
use crate::image::ImageView;

/// Element (c, y, x) of the tensor `op` computes from `img`, as f32 (before the f16
/// conversion). `op` must have passed [`PreprocessOp::check`] for `img`.
pub fn element(img: &ImageView<'_>, op: &PreprocessOp, c: usize, y: usize, x: usize) -> f32 {
    let p = &op.params;
    let (cx, cy) = (p.content_x as usize, p.content_y as usize);
    let (cw, ch) = (p.content_w as usize, p.content_h as usize);
    if x < cx || y < cy || x >= cx + cw || y >= cy + ch {
        return p.pad[c];
    }
    let (dx, dy) = (x - cx, y - cy);
    let (x0, x1, wx) = (op.x_map.i0[dx] as usize, op.x_map.i1[dx] as usize, op.x_map.w1[dx]);
    let (y0, y1, wy) = (op.y_map.i0[dy] as usize, op.y_map.i1[dy] as usize, op.y_map.w1[dy]);
    let plane = if p.channels == 3 && p.swap_rb != 0 { 2 - c } else { c };
    let s = |u: usize, v: usize| -> f32 {
        if p.channels == 1 {
            pixel_grey(img, u, v)
        } else {
            pixel_rgb(img, u, v)[plane]
        }
    };
    let top = s(x0, y0) * (1.0 - wx) + s(x1, y0) * wx;
    let bot = s(x0, y1) * (1.0 - wx) + s(x1, y1) * wx;
    (top * (1.0 - wy) + bot * wy) * p.scale[c] + p.bias[c]
}

/// The whole tensor, element by element (slow: for tests and as the readable
/// definition). Same output as [`super::CpuBackend::preprocess`].
pub fn preprocess(img: &ImageView<'_>, op: &PreprocessOp, out: &mut Vec<u8>) -> Result<()> {
    op.check(img)?;
    let desc = op.params.tensor_desc();
    out.clear();
    out.resize(desc.byte_len(), 0);
    for c in 0..desc.channels as usize {
        for y in 0..desc.height as usize {
            for x in 0..desc.width as usize {
                write_element(desc.dtype, out, desc.index(c, y, x), element(img, op, c, y, x));
            }
        }
    }
    Ok(())
}
