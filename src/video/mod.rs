//! Video packets without ROS or GStreamer (docs/VIDEO.md): the codec a message names
//! ([`Codec`]), and what the node reads of a packet before a decoder sees it ([`probe`]):
//! whether it is a key frame, the parameter sets it carries, the picture size of its
//! sequence parameter set against the size limits, and whether its bytes are the codec
//! its message says (a refusal by cause, [`PacketError`]). The node's decode pipelines
//! (`capture/video.rs`) use it to start a stream at a key frame and to refuse what no
//! decoder should see; the fuzz harness feeds it arbitrary bytes.
//!
//! H.264 and H.265 packets are Annex B byte streams (start codes `00 00 01`), one access
//! unit each (foxglove_msgs/CompressedVideo's rule, and what ffmpeg_image_transport and
//! Isaac ROS's encoder publish). VP9 packets are one frame; AV1 packets one temporal unit
//! in the low overhead format (OBUs with sizes).

mod bits;
mod sps;

use crate::compressed::Limits;

/// A video codec the node takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Codec {
    /// H.264 / AVC.
    H264,
    /// H.265 / HEVC.
    H265,
    /// VP9.
    Vp9,
    /// AV1.
    Av1,
}

impl Codec {
    /// Every codec, in the order the docs list them.
    pub const ALL: [Codec; 4] = [Codec::H264, Codec::H265, Codec::Vp9, Codec::Av1];

    /// Its name as foxglove_msgs/CompressedVideo's `format` says it.
    pub fn name(self) -> &'static str {
        match self {
            Codec::H264 => "h264",
            Codec::H265 => "h265",
            Codec::Vp9 => "vp9",
            Codec::Av1 => "av1",
        }
    }

    /// The codec of a `format` (CompressedVideo, CompressedImage) or of the first token of
    /// FFMPEGPacket's `encoding` (libav's codec name `hevc`, or an encoder's name as older
    /// ffmpeg_image_transport publishers sent it: `libx264`, `h264_nvenc`, `hevc_nvenc`).
    /// Case is ignored; `None` for anything else.
    pub fn from_format(format: &str) -> Option<Codec> {
        let token = format.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match token.as_str() {
            "h264" | "avc" | "avc1" | "libx264" | "libopenh264" | "h264_nvenc" | "h264_vaapi"
            | "h264_qsv" | "h264_v4l2m2m" => Some(Codec::H264),
            "h265" | "hevc" | "hev1" | "hvc1" | "libx265" | "hevc_nvenc" | "hevc_vaapi"
            | "hevc_qsv" | "hevc_v4l2m2m" => Some(Codec::H265),
            "vp9" | "libvpx-vp9" | "vp9_vaapi" | "vp9_qsv" => Some(Codec::Vp9),
            "av1" | "libaom-av1" | "libsvtav1" | "av1_nvenc" | "av1_vaapi" | "av1_qsv" => {
                Some(Codec::Av1)
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a packet is refused before decoding. Each names what is wrong and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// No bytes.
    #[error("an empty packet (`data` holds no bytes)")]
    Empty,
    /// H.264/H.265 bytes that do not start with an Annex B start code.
    #[error(
        "{codec}: the packet does not start with an Annex B start code (00 00 01): publish \
         the byte stream format (an AVCC/HVCC length-prefixed packet must be converted, e.g. \
         with h264_mp4toannexb)"
    )]
    NotAnnexB {
        /// The codec the message named.
        codec: Codec,
    },
    /// A NAL unit header or OBU header that the named codec does not have: the bytes are
    /// another codec's, or garbage.
    #[error(
        "the bytes are not {codec}: {what}; check the message's format/encoding against \
         the encoder's codec"
    )]
    NotCodec {
        /// The codec the message named.
        codec: Codec,
        /// The header found, e.g. `NAL unit 0 has type 51, which H.265 does not define`.
        what: String,
    },
    /// A parameter set or header cut short.
    #[error("{codec}: truncated: {what} ends before its last field")]
    Truncated {
        /// The codec.
        codec: Codec,
        /// What is cut short, e.g. `the sequence parameter set`.
        what: String,
    },
    /// A picture size over [`Limits`].
    #[error(
        "{codec}: {width}x{height} is over the size limits ({max_side} per side, {max_pixels} \
         pixels): encode at a smaller size"
    )]
    TooLarge {
        /// The codec.
        codec: Codec,
        /// The sequence parameter set's width.
        width: u32,
        /// Its height.
        height: u32,
        /// [`Limits::max_side`].
        max_side: u32,
        /// [`Limits::max_pixels`].
        max_pixels: u64,
    },
}

impl PacketError {
    /// Its cause as `/diagnostics` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            PacketError::Empty => "empty",
            PacketError::NotAnnexB { .. } => "not Annex B",
            PacketError::NotCodec { .. } => "not the named codec",
            PacketError::Truncated { .. } => "truncated",
            PacketError::TooLarge { .. } => "over the size limits",
        }
    }
}

/// What [`probe`] read of a packet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    /// A frame a decoder can start from (H.264 IDR, H.265 IRAP, VP9 key frame, AV1
    /// temporal unit with a sequence header).
    pub key: bool,
    /// The packet's parameter sets (H.264 SPS and PPS, H.265 VPS, SPS and PPS) as Annex B
    /// NAL units, for a later key frame that comes without them.
    pub parameter_sets: Vec<u8>,
    /// The packet holds a sequence parameter set (H.264, H.265).
    pub has_sps: bool,
    /// The picture size of its sequence parameter set.
    pub size: Option<(u32, u32)>,
}

/// Read `data`, a packet of `codec`: refused by cause ([`PacketError`]), or what a decoder
/// needs to know of it ([`Probe`]).
pub fn probe(codec: Codec, data: &[u8], limits: &Limits) -> Result<Probe, PacketError> {
    if data.is_empty() {
        return Err(PacketError::Empty);
    }
    let probe = match codec {
        Codec::H264 | Codec::H265 => probe_annex_b(codec, data)?,
        Codec::Vp9 => probe_vp9(data)?,
        Codec::Av1 => probe_av1(data)?,
    };
    if let Some((width, height)) = probe.size {
        let pixels = u64::from(width) * u64::from(height);
        if width > limits.max_side || height > limits.max_side || pixels > limits.max_pixels {
            return Err(PacketError::TooLarge {
                codec,
                width,
                height,
                max_side: limits.max_side,
                max_pixels: limits.max_pixels,
            });
        }
    }
    Ok(probe)
}

/// The NAL units of an Annex B packet: each one's bytes from its header to the next start
/// code (trailing zero bytes belong to the next start code). `None` when `data` does not
/// start with a start code (after any zero bytes).
fn nal_units(data: &[u8]) -> Option<Vec<&[u8]>> {
    let lead = data.iter().take_while(|&&b| b == 0).count();
    if lead < 2 || data.get(lead) != Some(&1) {
        return None;
    }
    let mut units = Vec::new();
    let mut start = lead + 1;
    let mut i = start;
    while i + 2 < data.len() {
        if data[i] == 0 && data[i + 1] == 0 && data[i + 2] == 1 {
            units.push(trim_zeros(&data[start..i]));
            start = i + 3;
            i = start;
        } else {
            i += 1;
        }
    }
    units.push(trim_zeros(&data[start.min(data.len())..]));
    Some(units)
}

fn trim_zeros(nal: &[u8]) -> &[u8] {
    let end = nal.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    &nal[..end]
}

/// An H.264 NAL unit type that a stream can hold (7.4.1: 1 and 5-12 the base types, 13-15,
/// 19, 20 and 21 extensions); 0, 16-18 and 22-31 are reserved or unspecified, and 2-4 the
/// data partitions of the Extended profile, which no decoder here takes.
fn h264_type_known(t: u8) -> bool {
    matches!(t, 1 | 5..=15 | 19..=21)
}

/// An H.265 NAL unit type that a stream can hold (7.4.2.2: 0-9 and 16-21 pictures, 32-40
/// parameter sets, delimiters, SEI); the rest reserved or unspecified.
fn h265_type_known(t: u8) -> bool {
    matches!(t, 0..=9 | 16..=21 | 32..=40)
}

/// An H.264 or H.265 access unit: its NAL headers checked, key frame, parameter sets,
/// the SPS's size.
fn probe_annex_b(codec: Codec, data: &[u8]) -> Result<Probe, PacketError> {
    let units = nal_units(data).ok_or(PacketError::NotAnnexB { codec })?;
    let not = |what: String| PacketError::NotCodec { codec, what };
    let truncated = |what: &str| PacketError::Truncated { codec, what: what.to_string() };
    let mut probe = Probe::default();
    for (i, nal) in units.iter().enumerate() {
        let header = if codec == Codec::H264 { 1 } else { 2 };
        let Some(&first) = nal.first() else {
            return Err(truncated(&format!("NAL unit {i} (an empty one)")));
        };
        if first & 0x80 != 0 {
            return Err(not(format!("NAL unit {i} has its forbidden_zero_bit set")));
        }
        let (parameter_set, key, sps) = if codec == Codec::H264 {
            let t = first & 0x1f;
            if !h264_type_known(t) {
                return Err(not(format!("NAL unit {i} has type {t}, which H.264 does not define")));
            }
            (matches!(t, 7 | 8), t == 5, t == 7)
        } else {
            let t = (first >> 1) & 0x3f;
            let second = *nal.get(1).ok_or_else(|| truncated(&format!("NAL unit {i}'s header")))?;
            let layer = ((first & 1) << 5) | (second >> 3);
            if !h265_type_known(t) || second & 7 == 0 || layer > 62 {
                return Err(not(format!(
                    "NAL unit {i} has type {t}, layer {layer}, temporal id + 1 = {}, which \
                     H.265 does not define",
                    second & 7
                )));
            }
            (matches!(t, 32..=34), (16..=21).contains(&t), t == 33)
        };
        if nal.len() <= header {
            return Err(truncated(&format!("NAL unit {i} (no payload after its header)")));
        }
        probe.key |= key;
        if parameter_set {
            probe.parameter_sets.extend_from_slice(&[0, 0, 0, 1]);
            probe.parameter_sets.extend_from_slice(nal);
        }
        if sps {
            probe.has_sps = true;
            let size = match codec {
                Codec::H264 => sps::h264_size(&nal[1..]),
                _ => sps::h265_size(&nal[2..]),
            };
            probe.size = Some(size.map_err(|_| truncated("the sequence parameter set"))?);
        }
    }
    Ok(probe)
}

/// A VP9 frame: its uncompressed header's frame marker and frame type (VP9 6.2).
fn probe_vp9(data: &[u8]) -> Result<Probe, PacketError> {
    let b = data[0];
    if b >> 6 != 0b10 {
        return Err(PacketError::NotCodec {
            codec: Codec::Vp9,
            what: format!("the frame marker is {:02b}, not 10", b >> 6),
        });
    }
    let profile = ((b >> 5) & 1) | (((b >> 4) & 1) << 1);
    // Profile 3 has a reserved zero bit before show_existing_frame.
    let shift = if profile == 3 { 2 } else { 3 };
    let show_existing = (b >> shift) & 1;
    let key = show_existing == 0 && (b >> (shift - 1)) & 1 == 0;
    Ok(Probe { key, ..Probe::default() })
}

/// An AV1 temporal unit: its OBU headers (AV1 5.3); a key frame when it holds a sequence
/// header (foxglove_msgs/CompressedVideo's rule for key frames).
fn probe_av1(data: &[u8]) -> Result<Probe, PacketError> {
    let mut probe = Probe::default();
    let mut at = 0;
    while at < data.len() {
        let header = data[at];
        let obu_type = (header >> 3) & 0xf;
        if header & 0x80 != 0 || matches!(obu_type, 0 | 9..=14) {
            return Err(PacketError::NotCodec {
                codec: Codec::Av1,
                what: format!("an OBU header {header:#04x} at byte {at}"),
            });
        }
        let extension = usize::from((header >> 2) & 1);
        if header & 2 == 0 {
            // No size field: the OBU runs to the end of the packet.
            probe.key |= obu_type == 1;
            break;
        }
        let mut pos = at + 1 + extension;
        let mut size: u64 = 0;
        for i in 0..8 {
            let byte = *data.get(pos).ok_or(PacketError::Truncated {
                codec: Codec::Av1,
                what: format!("the OBU at byte {at}"),
            })?;
            pos += 1;
            size |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                break;
            }
        }
        probe.key |= obu_type == 1;
        at = pos.saturating_add(usize::try_from(size).unwrap_or(usize::MAX));
        if at > data.len() {
            return Err(PacketError::Truncated {
                codec: Codec::Av1,
                what: format!("OBU of type {obu_type} ({size} bytes)"),
            });
        }
    }
    Ok(probe)
}

#[cfg(test)]
mod tests;
