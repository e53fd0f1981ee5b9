//! What the network sees, as an 8-bit image (`debug_image`, `vision_preproc run --preview`):
//! the tensors de-normalized.

use crate::backend::{self, PreprocessParams};
use crate::error::{Error, Result};

/// An 8-bit image of what the network sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewImage {
    /// Network image width.
    pub width: u32,
    /// Network image height.
    pub height: u32,
    /// 3 (RGB, whatever the tensor's channel order) or 1 (grey).
    pub channels: u32,
    /// Rows of `width * channels` bytes.
    pub data: Vec<u8>,
}

/// De-normalize a tensor written by `params` back to 8-bit source units, the inverse of
/// `value = pixel * scale[c] + bias[c]`: `pixel = (value - bias[c]) / scale[c]`, rounded
/// and clamped to 0..=255, channels back in RGB order. Letterbox padding shows as
/// `pad_value`.
pub fn preview(params: &PreprocessParams, tensor: &[u8]) -> PreviewImage {
    let desc = params.tensor_desc();
    let (w, h, ch) = (desc.width as usize, desc.height as usize, desc.channels as usize);
    let mut data = vec![0u8; w * h * ch];
    for y in 0..h {
        for x in 0..w {
            for c in 0..ch {
                let v = backend::read_element(desc.dtype, tensor, desc.index(c, y, x));
                let pixel = (v - params.bias[c]) / params.scale[c];
                let rgb = if ch == 3 && params.swap_rb != 0 { 2 - c } else { c };
                data[(y * w + x) * ch + rgb] = pixel.round().clamp(0.0, 255.0) as u8;
            }
        }
    }
    PreviewImage { width: desc.width, height: desc.height, channels: desc.channels, data }
}

/// [`preview`] of each of the tensors in `tensors` (one or a batch's items, all written
/// by `params`), stacked top to bottom: one image `width` wide and `n * height` high.
pub(crate) fn preview_items(params: &PreprocessParams, tensors: &[u8]) -> Result<PreviewImage> {
    let one = params.tensor_desc().byte_len();
    if one == 0 || !tensors.len().is_multiple_of(one) {
        return Err(Error::misuse(
            "preview",
            format!("{} tensor bytes are not a whole number of {one}-byte tensors", tensors.len()),
        ));
    }
    let mut items = tensors.chunks_exact(one).map(|t| preview(params, t));
    let Some(mut out) = items.next() else {
        return Err(Error::misuse("preview", "no tensor to show"));
    };
    for item in items {
        out.height += item.height;
        out.data.extend_from_slice(&item.data);
    }
    Ok(out)
}
