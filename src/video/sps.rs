//! The picture size in a sequence parameter set (H.264 7.3.2.1.1, H.265 7.3.2.2), read
//! before the decoder sees the stream so that a stream over the size limits is refused by
//! its size, not after a decoder has allocated its frames. Only the fields before the
//! size (and the cropping / conformance window after it) are read.

use super::bits::{rbsp, Bits, Short};

/// The H.264 profiles whose SPS carries chroma_format_idc, bit depths and scaling lists.
const H264_HIGH_PROFILES: [u32; 13] =
    [100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135];

/// The displayed size of an H.264 SPS (`payload`: the NAL unit after its 1-byte header).
pub(crate) fn h264_size(payload: &[u8]) -> Result<(u32, u32), Short> {
    let data = rbsp(payload);
    let mut b = Bits::new(&data);
    let profile = b.bits(8)?;
    b.skip(16)?; // constraint flags, level_idc
    b.ue()?; // seq_parameter_set_id
    let mut chroma = 1;
    if H264_HIGH_PROFILES.contains(&profile) {
        chroma = b.ue()?;
        if chroma == 3 {
            b.bit()?; // separate_colour_plane_flag
        }
        b.ue()?; // bit_depth_luma_minus8
        b.ue()?; // bit_depth_chroma_minus8
        b.bit()?; // qpprime_y_zero_transform_bypass_flag
        if b.bit()? == 1 {
            let lists = if chroma == 3 { 12 } else { 8 };
            for i in 0..lists {
                if b.bit()? == 1 {
                    skip_scaling_list(&mut b, if i < 6 { 16 } else { 64 })?;
                }
            }
        }
    }
    b.ue()?; // log2_max_frame_num_minus4
    match b.ue()? {
        0 => {
            b.ue()?; // log2_max_pic_order_cnt_lsb_minus4
        }
        1 => {
            b.bit()?;
            b.se()?;
            b.se()?;
            for _ in 0..b.ue()?.min(255) {
                b.se()?;
            }
        }
        _ => {}
    }
    b.ue()?; // max_num_ref_frames
    b.bit()?; // gaps_in_frame_num_value_allowed_flag
    let width_mbs = u64::from(b.ue()?) + 1;
    let height_units = u64::from(b.ue()?) + 1;
    let frame_mbs_only = u64::from(b.bit()?);
    if frame_mbs_only == 0 {
        b.bit()?; // mb_adaptive_frame_field_flag
    }
    b.bit()?; // direct_8x8_inference_flag
    let (crop_x, crop_y) = crop(&mut b, chroma)?;
    let crop_y = crop_y * (2 - frame_mbs_only);
    let width = (width_mbs * 16).saturating_sub(crop_x);
    let height = ((2 - frame_mbs_only) * height_units * 16).saturating_sub(crop_y);
    Ok((clamp(width), clamp(height)))
}

/// The cropping window's flag and offsets (H.264 frame_cropping, H.265
/// conformance_window: the same four values in chroma units): the pixels cropped
/// horizontally and vertically (H.264 field coding doubles the vertical, its caller's).
fn crop(b: &mut Bits<'_>, chroma: u32) -> Result<(u64, u64), Short> {
    if b.bit()? == 0 {
        return Ok((0, 0));
    }
    let (l, r, t, bo) = (b.ue()?, b.ue()?, b.ue()?, b.ue()?);
    let (unit_x, unit_y) = match chroma {
        1 => (2, 2),
        2 => (2, 1),
        _ => (1, 1),
    };
    Ok((unit_x * (u64::from(l) + u64::from(r)), unit_y * (u64::from(t) + u64::from(bo))))
}

/// A scaling list of `size` entries (7.3.2.1.1.1), skipped.
fn skip_scaling_list(b: &mut Bits<'_>, size: usize) -> Result<(), Short> {
    let (mut last, mut next) = (8i64, 8i64);
    for _ in 0..size {
        if next != 0 {
            next = (last + b.se()? + 256).rem_euclid(256);
        }
        last = if next == 0 { last } else { next };
    }
    Ok(())
}

/// The displayed size of an H.265 SPS (`payload`: the NAL unit after its 2-byte header).
pub(crate) fn h265_size(payload: &[u8]) -> Result<(u32, u32), Short> {
    let data = rbsp(payload);
    let mut b = Bits::new(&data);
    b.bits(4)?; // sps_video_parameter_set_id
    let sub_layers = b.bits(3)? as usize; // sps_max_sub_layers_minus1
    b.bit()?; // sps_temporal_id_nesting_flag
              // profile_tier_level(1, sub_layers): the general profile (88 bits) and level (8).
    b.skip(96)?;
    let mut present = Vec::with_capacity(sub_layers);
    for _ in 0..sub_layers {
        present.push((b.bit()?, b.bit()?));
    }
    if sub_layers > 0 {
        b.skip(2 * (8 - sub_layers))?;
    }
    for (profile, level) in present {
        b.skip(88 * profile as usize + 8 * level as usize)?;
    }
    b.ue()?; // sps_seq_parameter_set_id
    let chroma = b.ue()?;
    if chroma == 3 {
        b.bit()?; // separate_colour_plane_flag
    }
    let (width, height) = (u64::from(b.ue()?), u64::from(b.ue()?));
    let (crop_x, crop_y) = crop(&mut b, chroma)?;
    Ok((clamp(width.saturating_sub(crop_x)), clamp(height.saturating_sub(crop_y))))
}

fn clamp(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}
