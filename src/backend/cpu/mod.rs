//! The CPU backend: the specification of what vision_preproc computes. One pass per
//! output element (sample, convert, normalize, store), rows in parallel.

mod conv;

pub use conv::{border_index, conv2d, ConvScratch};

use crate::backend::{Backend, Conv2dOp, PreprocessOp, StageTimes};
use crate::config::DType;
use crate::error::{ImageError, Result};
use crate::image::{Encoding, ImageView};
use rayon::prelude::*;
use std::time::Instant;

/// The CPU backend (rayon thread pool).
#[derive(Debug, Default)]
pub struct CpuBackend {
    scratch: Vec<f32>,
    conv_scratch: conv::ConvScratch,
}

impl CpuBackend {
    /// A CPU backend using rayon's global pool.
    pub fn new() -> Self {
        CpuBackend::default()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_description(&self) -> String {
        format!("CPU, {} threads", rayon::current_num_threads())
    }

    fn process(
        &mut self,
        image: &ImageView<'_>,
        op: &PreprocessOp,
        conv: Option<&Conv2dOp>,
        out: &mut Vec<u8>,
    ) -> Result<StageTimes> {
        let start = Instant::now();
        let desc = op.params.tensor_desc();
        self.scratch.resize(desc.len(), 0.0);
        preprocess_f32(image, op, &mut self.scratch)?;
        let preprocess_us = start.elapsed().as_secs_f32() * 1e6;
        let conv_us = conv::apply(&desc, conv, &mut self.scratch, &mut self.conv_scratch)?;
        store(&self.scratch, desc.dtype, out);
        Ok(StageTimes { preprocess_us, conv_us, ..StageTimes::default() })
    }
}

/// Decode the pixel at (x, y) to RGB in 8-bit units.
#[inline]
fn fetch_rgb(data: &[u8], step: usize, enc: Encoding, x: usize, y: usize) -> [f32; 3] {
    let row = &data[y * step..];
    match enc {
        Encoding::Rgb8 => {
            let p = &row[x * 3..x * 3 + 3];
            [f32::from(p[0]), f32::from(p[1]), f32::from(p[2])]
        }
        Encoding::Bgr8 => {
            let p = &row[x * 3..x * 3 + 3];
            [f32::from(p[2]), f32::from(p[1]), f32::from(p[0])]
        }
        Encoding::Rgba8 => {
            let p = &row[x * 4..x * 4 + 3];
            [f32::from(p[0]), f32::from(p[1]), f32::from(p[2])]
        }
        Encoding::Bgra8 => {
            let p = &row[x * 4..x * 4 + 3];
            [f32::from(p[2]), f32::from(p[1]), f32::from(p[0])]
        }
        _ => {
            let v = f32::from(row[x]);
            [v, v, v]
        }
    }
}

/// The fused pass into an f32 tensor in the output layout.
pub fn preprocess_f32(image: &ImageView<'_>, op: &PreprocessOp, dst: &mut [f32]) -> Result<()> {
    let enc = image.encoding();
    if !matches!(
        enc,
        Encoding::Rgb8 | Encoding::Bgr8 | Encoding::Rgba8 | Encoding::Bgra8 | Encoding::Mono8
    ) {
        return Err(ImageError::UnknownEncoding(format!(
            "{enc} (not yet implemented on the CPU backend)"
        ))
        .into());
    }
    let p = &op.params;
    let desc = p.tensor_desc();
    let (w, h, ch) = (p.dst_width as usize, p.dst_height as usize, p.channels as usize);
    let data = image.data();
    let step = image.step() as usize;
    let cx = p.content_x as usize..(p.content_x + p.content_w) as usize;
    let cy = p.content_y as usize..(p.content_y + p.content_h) as usize;
    // Compute each row interleaved, then scatter to the layout.
    let rows: Vec<Vec<f32>> = (0..h)
        .into_par_iter()
        .map(|y| {
            let mut row = vec![0.0f32; w * ch];
            for x in 0..w {
                let px = &mut row[x * ch..x * ch + ch];
                if !cx.contains(&x) || !cy.contains(&y) {
                    px.copy_from_slice(&p.pad[..ch]);
                    continue;
                }
                let (dx, dy) = (x - cx.start, y - cy.start);
                let (x0, x1, wx) =
                    (op.x_map.i0[dx] as usize, op.x_map.i1[dx] as usize, op.x_map.w1[dx]);
                let (y0, y1, wy) =
                    (op.y_map.i0[dy] as usize, op.y_map.i1[dy] as usize, op.y_map.w1[dy]);
                let s00 = fetch_rgb(data, step, enc, x0, y0);
                let s01 = fetch_rgb(data, step, enc, x1, y0);
                let s10 = fetch_rgb(data, step, enc, x0, y1);
                let s11 = fetch_rgb(data, step, enc, x1, y1);
                let mut rgb = [0.0f32; 3];
                for k in 0..3 {
                    let top = s00[k] * (1.0 - wx) + s01[k] * wx;
                    let bot = s10[k] * (1.0 - wx) + s11[k] * wx;
                    rgb[k] = top * (1.0 - wy) + bot * wy;
                }
                for (c, v) in px.iter_mut().enumerate() {
                    let src = if ch == 1 {
                        rgb[0]
                    } else if p.swap_rb != 0 {
                        rgb[2 - c]
                    } else {
                        rgb[c]
                    };
                    *v = src * p.scale[c] + p.bias[c];
                }
            }
            row
        })
        .collect();
    for (y, row) in rows.iter().enumerate() {
        for x in 0..w {
            for c in 0..ch {
                dst[desc.index(c, y, x)] = row[x * ch + c];
            }
        }
    }
    Ok(())
}

/// Store f32 values as little-endian bytes of `dtype`.
pub fn store(src: &[f32], dtype: DType, out: &mut Vec<u8>) {
    out.clear();
    match dtype {
        DType::Float32 => out.extend(src.iter().flat_map(|v| v.to_le_bytes())),
        DType::Float16 => {
            out.extend(src.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()))
        }
    }
}
