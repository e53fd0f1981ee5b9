//! PNG: the header read without decoding and the CPU decode. The IHDR and a walk over the
//! chunks to IEND, each checked to lie inside the data (`png_header`); the encoding the
//! decode gives (palette and low bit depths expanded, alpha kept for 8-bit RGBA only); the
//! png crate for the pixels, 16-bit samples swapped to little-endian (`decode_png`).

use std::io::Cursor;

use super::{be32, check_size, describe_start, Codec, DecodeError, Decoded, Limits};
use crate::image::Encoding;

/// The eight bytes every PNG starts with.
pub(super) const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

/// What a PNG's IHDR declares, and whether a tRNS chunk (transparency, which the
/// expansion turns into an alpha channel) is present.
#[derive(Debug, Clone, Copy)]
pub(super) struct PngHeader {
    pub(super) width: u32,
    pub(super) height: u32,
    bit_depth: u8,
    color_type: u8,
    transparency: bool,
}

impl PngHeader {
    /// The encoding [`decode_png`] gives: palette and 1/2/4-bit grey expanded to 8 bits,
    /// tRNS to alpha; alpha kept only for 8-bit RGBA (see the module's notes).
    pub(super) fn encoding(&self) -> Result<Encoding, DecodeError> {
        let sixteen = self.bit_depth == 16;
        let valid_depth = match self.color_type {
            0 => matches!(self.bit_depth, 1 | 2 | 4 | 8 | 16),
            3 => matches!(self.bit_depth, 1 | 2 | 4 | 8),
            2 | 4 | 6 => matches!(self.bit_depth, 8 | 16),
            _ => false,
        };
        if !valid_depth {
            return Err(DecodeError::Corrupt {
                codec: Codec::Png,
                message: format!(
                    "IHDR declares colour type {} at bit depth {}, which PNG does not define",
                    self.color_type, self.bit_depth
                ),
            });
        }
        Ok(match (self.color_type, sixteen) {
            (0 | 4, false) => Encoding::Mono8,
            (0 | 4, true) => Encoding::Mono16,
            (2, false) if self.transparency => Encoding::Rgba8,
            (2, false) => Encoding::Rgb8,
            (3, _) if self.transparency => Encoding::Rgba8,
            (3, _) => Encoding::Rgb8,
            (6, false) => Encoding::Rgba8,
            _ => Encoding::Rgb16,
        })
    }
}

/// Read a PNG's IHDR and walk its chunks to IEND, checking that each lies inside the
/// data, without decoding.
pub(super) fn png_header(data: &[u8]) -> Result<PngHeader, DecodeError> {
    let truncated =
        |detail: String| DecodeError::Truncated { codec: Codec::Png, detail, len: data.len() };
    if !data.starts_with(&PNG_SIGNATURE) {
        return Err(DecodeError::Signature { expected: Codec::Png, found: describe_start(data) });
    }
    if data.len() < 8 + 8 + 13 {
        return Err(truncated("the data ends inside the IHDR chunk".into()));
    }
    if &data[12..16] != b"IHDR" || be32(data, 8) != 13 {
        return Err(DecodeError::Corrupt {
            codec: Codec::Png,
            message: "the first chunk is not a 13-byte IHDR".into(),
        });
    }
    let mut header = PngHeader {
        width: be32(data, 16),
        height: be32(data, 20),
        bit_depth: data[24],
        color_type: data[25],
        transparency: false,
    };
    let mut pos = 8usize;
    loop {
        if pos + 8 > data.len() {
            return Err(truncated(format!("the data ends at byte {pos}, before IEND")));
        }
        let len = be32(data, pos) as usize;
        let end = pos.saturating_add(12).saturating_add(len);
        if end > data.len() {
            let name = String::from_utf8_lossy(&data[pos + 4..pos + 8]).into_owned();
            return Err(truncated(format!(
                "chunk `{name}` at byte {pos} declares {len} bytes, {} past the end",
                end - data.len()
            )));
        }
        match &data[pos + 4..pos + 8] {
            b"IEND" => return Ok(header),
            b"tRNS" => header.transparency = true,
            _ => {}
        }
        pos = end;
    }
}

/// Decode a PNG whose headers [`Compressed::probe`] checked; `expected` is the encoding
/// the probe read from them (the decoder must agree).
pub(super) fn decode_png(
    data: &[u8],
    limits: &Limits,
    expected: Encoding,
) -> Result<Decoded, DecodeError> {
    use png::BitDepth;
    let header = png_header(data)?;
    let (width, height) = (header.width, header.height);
    check_size(width, height, limits)?;
    let corrupt =
        |e: png::DecodingError| DecodeError::Corrupt { codec: Codec::Png, message: e.to_string() };
    let mut decoder = png::Decoder::new(Cursor::new(data));
    // Palette -> RGB(A), 1/2/4-bit grey -> 8-bit, tRNS -> alpha; 16-bit kept.
    decoder.set_transformations(png::Transformations::EXPAND);
    // The output (at most 8 bytes a pixel after expansion) and the decoder's own buffers.
    let output_max = limits.max_pixels.saturating_mul(8).saturating_add(1 << 20);
    decoder.set_limits(png::Limits { bytes: usize::try_from(output_max).unwrap_or(usize::MAX) });
    let mut reader = decoder.read_info().map_err(corrupt)?;
    let size = reader.output_buffer_size().ok_or(DecodeError::TooLarge {
        width,
        height,
        max_side: limits.max_side,
        max_pixels: limits.max_pixels,
    })?;
    let mut buf = vec![0u8; size];
    let info = reader.next_frame(&mut buf).map_err(corrupt)?;
    buf.truncate(info.buffer_size());
    let sixteen = info.bit_depth == BitDepth::Sixteen;
    let (stored, kept, encoding) = channels(info.color_type, info.bit_depth)?;
    if encoding != expected || (info.width, info.height) != (width, height) {
        return Err(DecodeError::Corrupt {
            codec: Codec::Png,
            message: format!(
                "the headers declare {width}x{height} {} but the data decodes to {}x{} {}",
                expected.name(),
                info.width,
                info.height,
                encoding.name()
            ),
        });
    }
    let pixels = repack(&buf, stored, kept, if sixteen { 2 } else { 1 });
    Decoded::new(Codec::Png, info.width, info.height, encoding, pixels, limits)
}

/// A decoded PNG's channels stored, those kept and its encoding, after expansion (alpha
/// kept for 8-bit RGBA only).
fn channels(
    color_type: png::ColorType,
    depth: png::BitDepth,
) -> Result<(usize, usize, Encoding), DecodeError> {
    use png::ColorType;
    let sixteen = depth == png::BitDepth::Sixteen;
    // (channels stored, channels kept, encoding)
    Ok(match (color_type, sixteen) {
        (ColorType::Grayscale, false) => (1, 1, Encoding::Mono8),
        (ColorType::Grayscale, true) => (1, 1, Encoding::Mono16),
        (ColorType::GrayscaleAlpha, false) => (2, 1, Encoding::Mono8),
        (ColorType::GrayscaleAlpha, true) => (2, 1, Encoding::Mono16),
        (ColorType::Rgb, false) => (3, 3, Encoding::Rgb8),
        (ColorType::Rgb, true) => (3, 3, Encoding::Rgb16),
        (ColorType::Rgba, false) => (4, 4, Encoding::Rgba8),
        (ColorType::Rgba, true) => (4, 3, Encoding::Rgb16),
        (other, _) => {
            return Err(DecodeError::Corrupt {
                codec: Codec::Png,
                message: format!("{other:?} at {depth:?} after expansion"),
            })
        }
    })
}

/// Keep the first `kept` of every `stored` samples of `bytes_per_sample` bytes, with 16-bit
/// samples swapped from PNG's big-endian to little-endian. Without alpha to drop or bytes
/// to swap, the buffer is returned as it is.
fn repack(buf: &[u8], stored: usize, kept: usize, bytes_per_sample: usize) -> Vec<u8> {
    if stored == kept && bytes_per_sample == 1 {
        return buf.to_vec();
    }
    let pixel = stored * bytes_per_sample;
    let mut out = Vec::with_capacity(buf.len() / stored * kept);
    for px in buf.chunks_exact(pixel) {
        for sample in px[..kept * bytes_per_sample].chunks_exact(bytes_per_sample) {
            out.extend(sample.iter().rev());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compressed::decode;
    use crate::compressed::tests::{photo, png_bytes};

    #[test]
    fn png_photographs_decode_bit_exact() {
        // RGB, grey, RGBA and 16-bit grey/RGB, against the image crate's own decode.
        let rgb = photo("chelsea.png").to_rgb8();
        let d = decode(
            "bgr8; png compressed bgr8",
            &png_bytes(&rgb.clone().into()),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(
            (d.view().encoding(), d.view().width(), d.view().height()),
            (Encoding::Rgb8, rgb.width(), rgb.height())
        );
        assert_eq!(d.view().step(), rgb.width() * 3);
        assert_eq!(d.view().data(), rgb.as_raw().as_slice());
        assert_eq!(d.view().data().len(), rgb.as_raw().len());

        let grey = photo("camera.png").to_luma8();
        let d = decode("png", &png_bytes(&grey.clone().into()), &Limits::default()).unwrap();
        assert_eq!(d.view().encoding(), Encoding::Mono8);
        assert_eq!(d.view().data(), grey.as_raw().as_slice());

        let rgba = photo("astronaut.png").to_rgba8();
        let d = decode("png", &png_bytes(&rgba.clone().into()), &Limits::default()).unwrap();
        assert_eq!(d.view().encoding(), Encoding::Rgba8);
        assert_eq!(d.view().data(), rgba.as_raw().as_slice());

        // 16-bit: PNG stores big-endian; we return little-endian (to_le_bytes below).
        let grey16 = photo("camera.png").to_luma16();
        let d =
            decode("16UC1; png compressed", &png_bytes(&grey16.clone().into()), &Limits::default())
                .unwrap();
        assert_eq!(d.view().encoding(), Encoding::Mono16);
        assert!(!d.view().big_endian());
        let le: Vec<u8> = grey16.as_raw().iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(d.view().data(), le.as_slice());

        let rgb16 = photo("chelsea.png").to_rgb16();
        let d = decode("png", &png_bytes(&rgb16.clone().into()), &Limits::default()).unwrap();
        assert_eq!(d.view().encoding(), Encoding::Rgb16);
        let le: Vec<u8> = rgb16.as_raw().iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(d.view().data(), le.as_slice());
    }
}
