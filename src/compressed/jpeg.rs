//! JPEG: the header read without decoding and the CPU decode. The marker walk up to the
//! frame header (SOFn) and first scan header, every segment's length checked against the
//! data (`jpeg_header`); the checks that name what we do not decode (the coding process,
//! the precision, the components, a missing end-of-image marker: `checked_jpeg_header`);
//! zune-jpeg for the pixels, with the standard Huffman tables put in where a frame has
//! none (`decode_jpeg`, [`super::huffman`]).

use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use super::huffman::with_standard_huffman_tables;
use super::{be16, check_size, describe_start, Codec, DecodeError, Decoded, Limits};
use crate::image::Encoding;

/// What a JPEG's frame header (SOFn) declares.
#[derive(Debug)]
pub(super) struct JpegHeader {
    /// The SOF marker's second byte (0xC0 baseline, 0xC2 progressive, ...).
    pub(super) marker: u8,
    precision: u8,
    pub(super) width: u32,
    pub(super) height: u32,
    components: u8,
    /// The Adobe APP14 segment's colour transform (0 none/CMYK or RGB, 1 YCbCr, 2 YCCK).
    adobe_transform: Option<u8>,
    /// Where the first scan (SOS) begins: the end-of-image marker must come after it.
    first_scan: Option<usize>,
    /// Whether a Huffman table (DHT) comes before the first scan.
    has_dht: bool,
}

/// Walk a JPEG's marker segments up to its frame header and first scan header, without
/// decoding: every length is checked against the data.
fn jpeg_header(data: &[u8]) -> Result<JpegHeader, DecodeError> {
    if !data.starts_with(&[0xFF, 0xD8]) {
        return Err(DecodeError::Signature { expected: Codec::Jpeg, found: describe_start(data) });
    }
    let mut header: Option<JpegHeader> = None;
    let mut adobe_transform = None;
    let mut has_dht = false;
    let mut pos = 2;
    loop {
        let (marker, after) = next_marker(data, pos)?;
        pos = after;
        match marker {
            // TEM and RSTn have no segment.
            0x01 | 0xD0..=0xD7 => continue,
            0xD8 => {
                return Err(corrupt(format!("a second start-of-image marker at byte {}", pos - 2)))
            }
            0xD9 => return Err(corrupt("end-of-image before any frame header or scan".into())),
            _ => {}
        }
        let len = segment_len(data, marker, pos)?;
        let segment = &data[pos + 2..pos + len];
        match marker {
            // SOF0..SOF15, except DHT (C4), JPG (C8) and DAC (CC).
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                if segment.len() < 6 {
                    return Err(corrupt(format!("frame header of {} bytes", segment.len())));
                }
                header = Some(JpegHeader {
                    marker,
                    precision: segment[0],
                    height: u32::from(be16(segment, 1)),
                    width: u32::from(be16(segment, 3)),
                    components: segment[5],
                    adobe_transform: None,
                    first_scan: None,
                    has_dht: false,
                });
            }
            // APP14 "Adobe": byte 11 of its payload is the colour transform.
            0xEE if segment.len() >= 12 && segment.starts_with(b"Adobe") => {
                adobe_transform = Some(segment[11]);
            }
            0xC4 => has_dht = true,
            0xDA => {
                let Some(mut h) = header else {
                    return Err(corrupt("a scan (SOS) before the frame header (SOF)".into()));
                };
                h.adobe_transform = adobe_transform;
                h.first_scan = Some(pos + len);
                h.has_dht = has_dht;
                return Ok(h);
            }
            _ => {}
        }
        pos += len;
    }
}

/// The marker at `pos` (after any fill bytes) and the position just after it.
fn next_marker(data: &[u8], mut pos: usize) -> Result<(u8, usize), DecodeError> {
    if pos >= data.len() {
        return Err(truncated(data, format!("the data ends at byte {pos}, inside the headers")));
    }
    if data[pos] != 0xFF {
        return Err(corrupt(format!("expected a marker at byte {pos}, found 0x{:02X}", data[pos])));
    }
    // Fill bytes (0xFF) may precede a marker.
    while pos < data.len() && data[pos] == 0xFF {
        pos += 1;
    }
    let Some(&marker) = data.get(pos) else {
        return Err(truncated(data, format!("the data ends at byte {pos}, inside a marker")));
    };
    Ok((marker, pos + 1))
}

/// The length of `marker`'s segment at `pos` (its two length bytes included), checked to
/// be at least 2 and to lie inside the data.
fn segment_len(data: &[u8], marker: u8, pos: usize) -> Result<usize, DecodeError> {
    if pos + 2 > data.len() {
        return Err(truncated(
            data,
            format!("the data ends at byte {pos}, inside marker 0x{marker:02X}'s length"),
        ));
    }
    let len = usize::from(be16(data, pos));
    if len < 2 {
        return Err(corrupt(format!("marker 0x{marker:02X} at byte {} has length {len}", pos - 2)));
    }
    if pos + len > data.len() {
        return Err(truncated(
            data,
            format!("marker 0x{marker:02X}'s segment at byte {pos} needs {len} bytes"),
        ));
    }
    Ok(len)
}

/// [`DecodeError::Truncated`] for a JPEG of `data`, ending where `detail` says.
fn truncated(data: &[u8], detail: String) -> DecodeError {
    DecodeError::Truncated { codec: Codec::Jpeg, detail, len: data.len() }
}

/// [`DecodeError::Corrupt`] for a JPEG.
fn corrupt(message: String) -> DecodeError {
    DecodeError::Corrupt { codec: Codec::Jpeg, message }
}

/// The name of a SOF process zune-jpeg does not decode, or `None` for one it does.
fn unsupported_process(marker: u8) -> Option<&'static str> {
    match marker {
        0xC0..=0xC2 => None,
        0xC3 => Some("lossless"),
        0xC5..=0xC7 => Some("hierarchical"),
        0xC9..=0xCA => Some("arithmetic-coded"),
        _ => Some("lossless arithmetic-coded or hierarchical arithmetic-coded"),
    }
}

/// A JPEG's frame header, checked: a process, precision and colour space we decode, a
/// size within `limits`, and the end-of-image marker after the first scan. With the
/// encoding it decodes to.
pub(super) fn checked_jpeg_header(
    data: &[u8],
    limits: &Limits,
) -> Result<(JpegHeader, Encoding), DecodeError> {
    let h = jpeg_header(data)?;
    if let Some(process) = unsupported_process(h.marker) {
        return Err(DecodeError::JpegProcess { marker: h.marker, process });
    }
    if h.precision != 8 {
        return Err(DecodeError::JpegPrecision { bits: h.precision });
    }
    let encoding = match h.components {
        1 => Encoding::Mono8,
        3 => Encoding::Rgb8,
        4 => {
            let space = if h.adobe_transform == Some(2) { "YCCK" } else { "CMYK" };
            return Err(DecodeError::CmykJpeg { space });
        }
        components => return Err(DecodeError::JpegComponents { components }),
    };
    check_size(h.width, h.height, limits)?;
    // The end-of-image marker after the first scan: no 0xFF 0xD9 can occur inside
    // entropy-coded data (a 0xFF there is followed by 0x00 or a RSTn), so without one the
    // data was cut. (zune-jpeg and libjpeg would fill the missing rows with grey.) Looked
    // for from the end, where it is: the probe runs on every frame, more than once, and a
    // forward search would read the whole scan each time.
    let scan = h.first_scan.unwrap_or(data.len());
    if !data[scan.min(data.len())..].windows(2).rev().any(|w| w == [0xFF, 0xD9]) {
        return Err(DecodeError::Truncated {
            codec: Codec::Jpeg,
            detail: "no end-of-image marker (FF D9) after the scan data".into(),
            len: data.len(),
        });
    }
    Ok((h, encoding))
}

pub(super) fn decode_jpeg(data: &[u8], limits: &Limits) -> Result<Decoded, DecodeError> {
    let (h, encoding) = checked_jpeg_header(data, limits)?;
    let colorspace = if encoding == Encoding::Mono8 { ColorSpace::Luma } else { ColorSpace::RGB };
    let options = DecoderOptions::default()
        .set_max_width(limits.max_side as usize)
        .set_max_height(limits.max_side as usize)
        .jpeg_set_out_colorspace(colorspace);
    // MJPEG cameras may leave out the Huffman tables: the standard's are implied (libjpeg
    // fills them in, zune-jpeg does not), so they are put in, as for nvJPEG: a copy.
    let data = if h.has_dht {
        std::borrow::Cow::Borrowed(data)
    } else {
        with_standard_huffman_tables(data)
    };
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(&data[..]), options);
    let pixels = decoder
        .decode()
        .map_err(|e| DecodeError::Corrupt { codec: Codec::Jpeg, message: e.to_string() })?;
    // Our header scan and zune-jpeg's agree on the size (both read the SOF): a mismatch is
    // a second frame header or a decoder bug; refuse rather than guess.
    let expected = h.width as usize * h.height as usize * encoding.bytes_per_pixel() as usize;
    if pixels.len() != expected {
        return Err(DecodeError::Corrupt {
            codec: Codec::Jpeg,
            message: format!(
                "decoded {} bytes but the frame header declares {}x{} ({expected} bytes)",
                pixels.len(),
                h.width,
                h.height
            ),
        });
    }
    Decoded::new(Codec::Jpeg, h.width, h.height, encoding, pixels, limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compressed::decode;
    use crate::compressed::tests::{jpeg_bytes, photo};
    use image::ImageFormat;

    #[test]
    fn jpeg_photographs_decode_near_the_image_crate() {
        // The image crate decodes JPEG with zune-jpeg too: the same pixels, exactly. (The
        // tolerance against OpenCV's libjpeg-turbo is test/python/test_compressed_decode.py's.)
        for (name, grey) in [("chelsea.png", false), ("rocket.jpg", false), ("camera.png", true)] {
            let img =
                if grey { photo(name).to_luma8().into() } else { photo(name).to_rgb8().into() };
            let bytes = jpeg_bytes(&img, 90);
            let d = decode("rgb8; jpeg compressed bgr8", &bytes, &Limits::default()).unwrap();
            let reference = image::load_from_memory_with_format(&bytes, ImageFormat::Jpeg).unwrap();
            let (enc, want) = if grey {
                (Encoding::Mono8, reference.to_luma8().into_raw())
            } else {
                (Encoding::Rgb8, reference.to_rgb8().into_raw())
            };
            assert_eq!(d.view().encoding(), enc, "{name}");
            assert_eq!(
                (d.view().width(), d.view().height()),
                (img.width(), img.height()),
                "{name}"
            );
            assert_eq!(d.view().data(), want.as_slice(), "{name}");
        }
    }

    #[test]
    fn jpeg_precision_components_and_process_are_named() {
        let jpeg = jpeg_bytes(&photo("camera.png").to_luma8().into(), 80);
        let sof = jpeg.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        // 12-bit: the precision byte (no encoder here writes 12-bit JPEG; the header is
        // enough, the refusal comes before decoding).
        let mut b = jpeg.clone();
        b[sof + 4] = 12;
        assert_eq!(
            decode("jpeg", &b, &Limits::default()).unwrap_err(),
            DecodeError::JpegPrecision { bits: 12 }
        );
        let mut b = jpeg.clone();
        b[sof + 1] = 0xC3;
        let e = decode("jpeg", &b, &Limits::default()).unwrap_err();
        assert_eq!(e, DecodeError::JpegProcess { marker: 0xC3, process: "lossless" });
        let mut b = jpeg.clone();
        b[sof + 9] = 4; // The component count (the segment is now too short: the count is read first).
        assert_eq!(decode("jpeg", &b, &Limits::default()).unwrap_err().kind(), "cmyk_jpeg");
        b[sof + 9] = 2;
        assert_eq!(
            decode("jpeg", &b, &Limits::default()).unwrap_err(),
            DecodeError::JpegComponents { components: 2 }
        );
    }
}
