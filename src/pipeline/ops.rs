//! The backend's operations of a configuration: the fused preprocessing of each input's
//! frame size (cached per input slot), the padded slot's, and the conv2d.

use super::geometry::Geometry;
use super::message::KeptItem;
use super::{FrameInput, Rejected};
use crate::backend::Frame;
use crate::backend::{Conv2dOp, PreprocessOp, PreprocessParams};
use crate::config::{ChannelOrder, Config};
use crate::error::{Error, Result};
use crate::wire::msgs::Header;

/// Per input slot, the operation of its last frame size: (width, height) -> (geometry, op).
type CachedOp = ((u32, u32), Geometry, PreprocessOp);

/// The operations of one configuration, made on first use.
pub(super) struct Ops {
    cached: Vec<Option<CachedOp>>,
    /// The operation padded batch slots use (the configuration's tensor and pad value).
    pad: Option<PreprocessOp>,
    conv: Option<Conv2dOp>,
}

impl Ops {
    /// The operations of a validated `cfg` (the conv2d made now, the rest on first use).
    pub(super) fn new(cfg: &Config) -> Result<Self> {
        Ok(Ops { cached: Vec::new(), pad: None, conv: conv_op(cfg)? })
    }

    /// The conv2d (`None`: `conv.kernel: none`).
    pub(super) fn conv(&self) -> Option<&Conv2dOp> {
        self.conv.as_ref()
    }

    /// The operation of input `slot`'s frame as last resolved.
    pub(super) fn frame_op(&self, slot: usize) -> Option<&PreprocessOp> {
        self.cached.get(slot)?.as_ref().map(|(_, _, op)| op)
    }

    /// The padded slot's operation ([`Ops::params`] made it).
    pub(super) fn pad(&self) -> Result<&PreprocessOp> {
        self.pad
            .as_ref()
            .ok_or_else(|| Error::misuse("pad", "no pad operation yet: params() makes it"))
    }

    /// Each input's operation (cached per slot and frame size) and geometry. A batch slot
    /// without a frame, or whose frame the configuration refuses, gets none (it is
    /// padded; the refusal is returned as (slot, reason)); for a single input the refusal
    /// is the error.
    pub(super) fn resolve(
        &mut self,
        cfg: &Config,
        items: &[FrameInput<'_, '_>],
    ) -> Result<(Vec<Option<Geometry>>, Rejected)> {
        let batch = cfg.is_batch();
        if self.cached.len() != items.len() {
            self.cached = (0..items.len()).map(|_| None).collect();
        }
        let mut geometries = Vec::with_capacity(items.len());
        let mut rejected = Vec::new();
        for (i, it) in items.iter().enumerate() {
            let Some(image) = it.image else {
                if !batch {
                    return Err(Error::misuse("process", "no frame to process"));
                }
                geometries.push(None);
                continue;
            };
            let key = (image.width(), image.height());
            let entry = match self.cached[i].take() {
                Some(c) if c.0 == key => c,
                _ => match Geometry::resolve(cfg, key.0, key.1) {
                    Ok(g) => {
                        let op = preprocess_op(cfg, &g);
                        (key, g, op)
                    }
                    Err(e) if batch => {
                        rejected.push((i, e.to_string()));
                        geometries.push(None);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            let (_, g, op) = self.cached[i].insert(entry);
            // Per-frame fields of the source (same size, maybe another encoding or step).
            op.params.set_source(image);
            geometries.push(Some(g.clone()));
        }
        Ok((geometries, rejected))
    }

    /// The parameters of the tensors written (size, layout, dtype, normalization): the
    /// pad operation's, which every slot shares.
    pub(super) fn params(&mut self, cfg: &Config) -> Result<PreprocessParams> {
        if self.pad.is_none() {
            self.pad = Some(pad_op(cfg)?);
        }
        Ok(self.pad()?.params)
    }
}

/// The frames the backend runs: each item's, unless its slot has no geometry (padded).
pub(super) fn images_of<'a, 'b>(
    items: &[FrameInput<'a, 'b>],
    geometries: &[Option<Geometry>],
) -> Vec<Option<Frame<'a, 'b>>> {
    items.iter().zip(geometries).map(|(it, g)| g.as_ref().and(it.image)).collect()
}

/// The items of a batch as kept in its message until the ages are known.
pub(super) fn kept_items(
    items: &[FrameInput<'_, '_>],
    geometries: &[Option<Geometry>],
) -> Vec<KeptItem> {
    items
        .iter()
        .zip(geometries)
        .map(|(it, g)| {
            let valid = g.is_some();
            KeptItem {
                topic: it.topic.to_string(),
                valid,
                repeated: valid && it.repeated,
                header: if valid { it.header.clone() } else { Header::default() },
                source_encoding: if valid { it.source_encoding.to_string() } else { String::new() },
                geometry: g.clone(),
            }
        })
        .collect()
}

/// Resolve the fused operation for one geometry.
pub fn preprocess_op(cfg: &Config, g: &Geometry) -> PreprocessOp {
    let channels = cfg.output_channels;
    let mut scale = [0.0f32; 3];
    let mut bias = [0.0f32; 3];
    let mut pad = [0.0f32; 3];
    let swap_rb = channels == 3 && cfg.channel_order == ChannelOrder::Bgr;
    for c in 0..channels as usize {
        let mean = Config::per_channel(&cfg.image_mean, c);
        let std = Config::per_channel(&cfg.image_stddev, c);
        scale[c] = (cfg.pixel_scale / std) as f32;
        bias[c] = (-mean / std) as f32;
        // pad_value is [R, G, B] in source units; output channel c is R, G or B.
        let pad_src = if channels == 1 {
            // Grey padding: the weights of the colour conversion (OpenCV 5's RGB2GRAY),
            // without integer rounding so [v, v, v] pads with exactly v.
            let p = |i: usize| Config::per_channel(&cfg.pad_value, i);
            crate::backend::cpu::decode::pad_grey([p(0), p(1), p(2)])
        } else {
            let rgb_index = if swap_rb { 2 - c } else { c };
            Config::per_channel(&cfg.pad_value, rgb_index)
        };
        pad[c] = ((pad_src * cfg.pixel_scale - mean) / std) as f32;
    }
    let params = PreprocessParams {
        src_width: g.source_width,
        src_height: g.source_height,
        src_step: 0,
        encoding: 0,
        big_endian: 0,
        dst_width: g.network_width,
        dst_height: g.network_height,
        content_x: g.content.x,
        content_y: g.content.y,
        content_w: g.content.w,
        content_h: g.content.h,
        channels,
        swap_rb: u32::from(swap_rb),
        layout: cfg.output_layout,
        dtype: cfg.output_dtype,
        interpolation: cfg.interpolation,
        scale,
        bias,
        pad,
    };
    PreprocessOp { params, x_map: g.x_map(cfg.interpolation), y_map: g.y_map(cfg.interpolation) }
}

/// The operation a padded batch slot is given: the configuration's tensor and pad value
/// (its source size is any that the configuration accepts).
pub(super) fn pad_op(cfg: &Config) -> Result<PreprocessOp> {
    let (w, h) = if cfg.roi.len() == 4 {
        let c = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
        (c(cfg.roi[0] + cfg.roi[2]), c(cfg.roi[1] + cfg.roi[3]))
    } else {
        (cfg.network_image_width, cfg.network_image_height)
    };
    let g = Geometry::resolve(cfg, w, h)?;
    Ok(preprocess_op(cfg, &g))
}

/// The conv2d operation of a configuration, or `None` for `conv.kernel: none`.
pub fn conv_op(cfg: &Config) -> Result<Option<Conv2dOp>> {
    super::conv::conv_op(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::pipeline::Pipeline;

    #[test]
    fn the_output_size_derived_once_is_the_pad_operations() {
        // Config::tensor_bytes sizes the pipeline's output and the node's DDS segment; the
        // pad operation's tensor is what the backends write: the same bytes, any shape.
        use crate::config::{DType, Layout};
        for (w, h, channels, dtype, layout, inputs) in [
            (640, 480, 3, DType::Float32, Layout::Nchw, &[][..]),
            (61, 37, 3, DType::Float16, Layout::Nhwc, &["x"][..]),
            (320, 320, 1, DType::Float32, Layout::Nhwc, &["a/image", "b/image"][..]),
            (17, 5, 3, DType::Float16, Layout::Nchw, &["a", "b", "c"][..]),
        ] {
            let cfg = Config {
                network_image_width: w,
                network_image_height: h,
                output_channels: channels,
                output_dtype: dtype,
                output_layout: layout,
                inputs: inputs.iter().map(|t| t.to_string()).collect(),
                image_mean: vec![0.5; channels as usize],
                image_stddev: vec![0.25; channels as usize],
                ..Config::default()
            };
            let items = if inputs.len() >= 2 { inputs.len() } else { 1 };
            let op = pad_op(&cfg).expect("pad op");
            assert_eq!(cfg.tensor_bytes(), op.params.tensor_desc().byte_len() * items, "{w}x{h}");
            let p = Pipeline::new(cfg, Box::new(CpuBackend::new())).expect("pipeline");
            assert_eq!(p.output_bytes(), op.params.tensor_desc().byte_len() * items);
        }
    }
}
