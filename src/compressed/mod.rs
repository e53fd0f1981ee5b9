//! `sensor_msgs/CompressedImage` payloads (JPEG, PNG) decoded on the CPU into tight pixel
//! rows that an [`ImageView`] lends to the pipeline, without ROS: the `format` string
//! parsed ([`Format`]), the header read and checked against [`Limits`] before a byte is
//! decoded, and each refusal named by its cause ([`DecodeError`]).
//!
//! ```text
//! CompressedImage { format, data }
//!     Format::parse(format)         "jpeg" | "png" | "<enc>; jpeg compressed <enc2>" | "<enc>; png compressed [<enc2>]"
//!     header (our own scan)         SOF / IHDR: size, precision, components; EOI / IEND present
//!     Limits                        at most 16384 per side and 64 Mpx by default (a decompression bomb)
//!     zune-jpeg | png               JPEG colour -> rgb8, grey -> mono8
//!                                   PNG rgb8/rgba8/mono8; 16-bit grey -> mono16, 16-bit colour -> rgb16
//!     Decoded::view()               an ImageView of tight rows, little-endian samples
//! ```
//!
//! **Why the header is read twice.** The decoders read it too, but they refuse a 12-bit or
//! CMYK JPEG with a message of their own (zune-jpeg: "The library can only parse 8-bit
//! images"), and a truncated JPEG decodes "successfully" with grey rows at the bottom
//! (zune-jpeg, like libjpeg, fills what is missing). Walking the markers (JPEG) or chunks
//! (PNG) ourselves costs microseconds and gives each refusal its cause: a node counts
//! truncated frames separately from corrupt ones, and a user told "CMYK" knows the fix.
//!
//! **Byte order.** PNG stores 16-bit samples big-endian; they are swapped to little-endian
//! here, so every [`Decoded`] has `big_endian == false` and the kernels' fast path.
//! Alpha (PNG RGBA and grey+alpha) is kept for 8-bit RGBA (the `rgba8` encoding, whose
//! alpha the kernels ignore) and dropped where no encoding holds it (16-bit RGBA -> rgb16,
//! grey+alpha -> mono8/mono16).
//!
//! One file per concern: the `format` string (`format.rs`), the JPEG header and decode
//! (`jpeg.rs`), the Huffman tables MJPEG frames leave out (`huffman.rs`), the PNG header
//! and decode (`png.rs`); here the checked frame ([`Compressed`]), the limits, the decoded
//! image and the errors.

mod format;
mod huffman;
mod jpeg;
mod png;

pub use format::{Codec, Format, ACCEPTED_FORMATS};
pub(crate) use huffman::{jpeg_pieces, with_standard_huffman_tables};

use self::jpeg::{checked_jpeg_header, decode_jpeg};
use self::png::{decode_png, png_header, PNG_SIGNATURE};
use crate::image::{Encoding, ImageError, ImageView};

/// How large a decoded image may be. The size is read from the header before anything is
/// decoded or allocated: a few hundred bytes of JPEG or PNG can declare 65535 x 65535
/// pixels (12 GiB of RGB), a decompression bomb that would stop a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest width and largest height, pixels. Default 16384 (16K; cameras stop near 8K).
    pub max_side: u32,
    /// Largest width * height. Default 64 Mi pixels (67,108,864: 8K x 8K; 384 MiB as
    /// 16-bit RGB).
    pub max_pixels: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_side: 16384, max_pixels: 64 * 1024 * 1024 }
    }
}

/// A decoded image: tightly packed rows (`step == width * bytes per pixel`), 16-bit
/// samples little-endian. Its fields agree with each other by construction, so
/// [`Decoded::view`] needs no second check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    width: u32,
    height: u32,
    step: u32,
    encoding: Encoding,
    data: Vec<u8>,
}

impl Decoded {
    /// The pixel bytes, owned.
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }
    /// The image as the pipeline takes it (little-endian samples).
    pub fn view(&self) -> ImageView<'_> {
        ImageView::validated(self.width, self.height, self.step, self.encoding, false, &self.data)
    }

    /// Tight rows of `encoding`, checked once against [`ImageView::with_encoding`] (which
    /// also keeps the buffer under the 2 GiB the kernels index: over it is `TooLarge`);
    /// the default `Limits` keep images far below that.
    fn new(
        codec: Codec,
        width: u32,
        height: u32,
        encoding: Encoding,
        data: Vec<u8>,
        limits: &Limits,
    ) -> Result<Self, DecodeError> {
        let too_large = DecodeError::TooLarge {
            width,
            height,
            max_side: limits.max_side,
            max_pixels: limits.max_pixels,
        };
        let step = width.checked_mul(encoding.bytes_per_pixel()).ok_or(too_large.clone())?;
        ImageView::with_encoding(width, height, step, encoding, false, &data).map_err(
            |e| match e {
                ImageError::Overflow { .. } => too_large,
                e => DecodeError::Corrupt { codec, message: format!("decoded image: {e}") },
            },
        )?;
        Ok(Decoded { width, height, step, encoding, data })
    }
}

/// Why a compressed image cannot be decoded. The frame is dropped; [`DecodeError::kind`]
/// names the cause for counting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The `format` string is none that we know.
    #[error("compressed image format `{0}` is not supported; use one of: {ACCEPTED_FORMATS} (compressedDepth is a different transport: subscribe to the raw depth image)")]
    UnknownFormat(String),
    /// The data does not start with the signature of the codec its format names.
    #[error("format says {expected} but the data starts with {found}; check the publisher's `format` field")]
    Signature {
        /// The codec of the `format` string.
        expected: Codec,
        /// What the first bytes look like (`PNG's signature`, `bytes 00 01 02 03`, ...).
        found: String,
    },
    /// The data ends before the image does (a JPEG without its end-of-image marker after
    /// the scan, a PNG whose chunks run past the end or without IEND).
    #[error("{codec} data is truncated: {detail} ({len} bytes); the message was cut (check the transport's maximum message size and the network)")]
    Truncated {
        /// JPEG or PNG.
        codec: Codec,
        /// Where the data ends.
        detail: String,
        /// The data's length.
        len: usize,
    },
    /// The data is damaged or not valid for its codec; the message is the decoder's.
    #[error("{codec} data is corrupt: {message}")]
    Corrupt {
        /// JPEG or PNG.
        codec: Codec,
        /// What is wrong (the decoder's message or our header scan's).
        message: String,
    },
    /// The header declares an image larger than [`Limits`] allows.
    #[error("declared size {width}x{height} is over the limit ({max_side} per side, {max_pixels} pixels); the image is refused before decoding (a decompression bomb, or raise the limits for a camera this large)")]
    TooLarge {
        /// Declared width.
        width: u32,
        /// Declared height.
        height: u32,
        /// [`Limits::max_side`].
        max_side: u32,
        /// [`Limits::max_pixels`].
        max_pixels: u64,
    },
    /// The header declares a width or height of zero.
    #[error("declared size {width}x{height}: both must be at least 1 (a JPEG whose height comes later in a DNL marker is not supported)")]
    ZeroSize {
        /// Declared width.
        width: u32,
        /// Declared height.
        height: u32,
    },
    /// A four-component JPEG (CMYK or YCCK, as print software writes): not a camera
    /// colour space.
    #[error("JPEG is {space} (4 components); vision_preproc decodes grey and YCbCr/RGB JPEG: publish camera images as bgr8/rgb8/mono8 JPEG")]
    CmykJpeg {
        /// `CMYK` or `YCCK` (Adobe APP14 transform 2).
        space: &'static str,
    },
    /// A JPEG whose samples are not 8-bit (12-bit or 16-bit lossless).
    #[error("JPEG has {bits}-bit samples; only 8-bit JPEG is decoded: send 16-bit images as PNG (`<enc>; png compressed`) or raw")]
    JpegPrecision {
        /// The frame header's sample precision.
        bits: u8,
    },
    /// A JPEG coding process other than Huffman-coded sequential or progressive DCT
    /// (lossless, hierarchical, arithmetic coding).
    #[error("JPEG uses the {process} process (SOF marker 0x{marker:02X}); only baseline, extended sequential and progressive Huffman-coded JPEG is decoded")]
    JpegProcess {
        /// The SOF marker's second byte.
        marker: u8,
        /// Its name.
        process: &'static str,
    },
    /// A JPEG with a component count other than 1 (grey), 3 (colour) or 4 (CMYK).
    #[error("JPEG has {components} components; only 1 (grey) or 3 (colour) are decoded")]
    JpegComponents {
        /// The frame header's component count.
        components: u8,
    },
}

impl DecodeError {
    /// A short, stable name of the cause (`truncated`, `too_large`, ...): for counting
    /// dropped frames by cause and for the tests.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::UnknownFormat(_) => "unknown_format",
            DecodeError::Signature { .. } => "signature",
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::Corrupt { .. } => "corrupt",
            DecodeError::TooLarge { .. } => "too_large",
            DecodeError::ZeroSize { .. } => "zero_size",
            DecodeError::CmykJpeg { .. } => "cmyk_jpeg",
            DecodeError::JpegPrecision { .. } => "jpeg_precision",
            DecodeError::JpegProcess { .. } => "jpeg_process",
            DecodeError::JpegComponents { .. } => "jpeg_components",
        }
    }
}

/// Decode a `sensor_msgs/CompressedImage` (`format`, `data`) into tight pixel rows
/// ([`Compressed::probe`], then [`Compressed::decode`]).
///
/// JPEG: colour -> rgb8, grey -> mono8 (zune-jpeg; its IDCT and chroma upsampling differ
/// from libjpeg-turbo's by a few levels: docs/SPEC.md, "Compressed inputs"). PNG: rgb8,
/// rgba8, mono8, mono16, rgb16 as stored (palette and 1/2/4-bit grey expanded to 8-bit),
/// bit-exact; 16-bit samples converted to little-endian.
pub fn decode(format: &str, data: &[u8], limits: &Limits) -> Result<Decoded, DecodeError> {
    Compressed::probe(format, data, limits)?.decode()
}

/// A compressed frame whose headers were read and checked (format, signature, size
/// against the limits, coding process, every segment or chunk inside the data, the end
/// marker present) but not decoded yet: what a backend receives, to decode where its
/// kernels run. Its size and the encoding the decode gives are known, so the frame's
/// operation (scale, letterbox) is chosen before any pixel exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compressed<'a> {
    codec: Codec,
    data: &'a [u8],
    width: u32,
    height: u32,
    encoding: Encoding,
    progressive: bool,
    limits: Limits,
}

impl<'a> Compressed<'a> {
    /// Read and check the headers of a `sensor_msgs/CompressedImage` (`format`, `data`):
    /// microseconds, nothing decoded or allocated. Every refusal that needs no decoding
    /// happens here (all but [`DecodeError::Corrupt`] entropy-coded data).
    pub fn probe(format: &str, data: &'a [u8], limits: &Limits) -> Result<Self, DecodeError> {
        let codec = Format::parse(format)?.codec;
        let (width, height, encoding, progressive) = match codec {
            Codec::Jpeg => {
                let (h, encoding) = checked_jpeg_header(data, limits)?;
                (h.width, h.height, encoding, h.marker == 0xC2)
            }
            Codec::Png => {
                let h = png_header(data)?;
                check_size(h.width, h.height, limits)?;
                (h.width, h.height, h.encoding()?, false)
            }
        };
        Ok(Compressed { codec, data, width, height, encoding, progressive, limits: *limits })
    }

    /// JPEG or PNG.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// The compressed bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Width in pixels, from the header.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height in pixels, from the header.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// The encoding the decode gives (JPEG: rgb8 or mono8; PNG: as stored).
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// Bytes per row of the decoded image (tight rows).
    pub fn step(&self) -> u32 {
        self.width * self.encoding.bytes_per_pixel()
    }

    /// A progressive JPEG (SOF2): hardware JPEG decoders take baseline only.
    pub fn progressive(&self) -> bool {
        self.progressive
    }

    /// Decode on the CPU (the spec's decoder: zune-jpeg, png).
    pub fn decode(&self) -> Result<Decoded, DecodeError> {
        match self.codec {
            Codec::Jpeg => decode_jpeg(self.data, &self.limits),
            Codec::Png => decode_png(self.data, &self.limits, self.encoding),
        }
    }
}

/// Refuse a declared size of zero or over `limits`.
fn check_size(width: u32, height: u32, limits: &Limits) -> Result<(), DecodeError> {
    if width == 0 || height == 0 {
        return Err(DecodeError::ZeroSize { width, height });
    }
    if width > limits.max_side
        || height > limits.max_side
        || u64::from(width) * u64::from(height) > limits.max_pixels
    {
        return Err(DecodeError::TooLarge {
            width,
            height,
            max_side: limits.max_side,
            max_pixels: limits.max_pixels,
        });
    }
    Ok(())
}

/// What the first bytes of a payload look like, for [`DecodeError::Signature`].
fn describe_start(data: &[u8]) -> String {
    if data.starts_with(&PNG_SIGNATURE) {
        "PNG's signature".into()
    } else if data.starts_with(&[0xFF, 0xD8]) {
        "JPEG's start-of-image marker".into()
    } else if data.is_empty() {
        "nothing (0 bytes)".into()
    } else {
        let head: Vec<String> = data.iter().take(4).map(|b| format!("{b:02x}")).collect();
        format!("bytes {}", head.join(" "))
    }
}

/// A big-endian u16 at `at` (the caller checked the bounds).
fn be16(data: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([data[at], data[at + 1]])
}

/// A big-endian u32 at `at` (the caller checked the bounds).
fn be32(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageEncoder, ImageFormat};
    use std::io::Cursor;

    pub(super) fn photo(name: &str) -> image::DynamicImage {
        let path = format!("{}/test/data/{name}", env!("CARGO_MANIFEST_DIR"));
        image::open(&path).unwrap()
    }

    pub(super) fn png_bytes(img: &image::DynamicImage) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    }

    pub(super) fn jpeg_bytes(img: &image::DynamicImage, quality: u8) -> Vec<u8> {
        let mut out = Vec::new();
        let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality);
        enc.write_image(img.as_bytes(), img.width(), img.height(), img.color().into()).unwrap();
        out
    }

    /// A 4x2 PNG written by the png crate with `color`, `depth`, optional palette and tRNS.
    fn tiny_png(color: ::png::ColorType, depth: ::png::BitDepth, trns: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = ::png::Encoder::new(&mut out, 4, 2);
        enc.set_color(color);
        enc.set_depth(depth);
        if color == ::png::ColorType::Indexed {
            enc.set_palette(vec![0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255]);
        }
        if let Some(t) = trns {
            enc.set_trns(t.to_vec());
        }
        let mut w = enc.write_header().unwrap();
        let bits = depth as usize * color.samples();
        let row = (4 * bits).div_ceil(8);
        w.write_image_data(&vec![1u8; row * 2]).unwrap();
        w.finish().unwrap();
        out
    }

    #[test]
    fn the_probe_reads_size_and_encoding_as_the_decode_gives_them() {
        use ::png::{BitDepth as D, ColorType as C};
        let mut cases: Vec<(&str, Vec<u8>)> = vec![
            ("jpeg", jpeg_bytes(&photo("chelsea.png").to_rgb8().into(), 80)),
            (
                "mono8; jpeg compressed mono8",
                jpeg_bytes(&photo("camera.png").to_luma8().into(), 80),
            ),
        ];
        for (color, depth, trns) in [
            (C::Grayscale, D::One, None),
            (C::Grayscale, D::Eight, Some(&[0u8, 3][..])),
            (C::Grayscale, D::Sixteen, None),
            (C::GrayscaleAlpha, D::Eight, None),
            (C::GrayscaleAlpha, D::Sixteen, None),
            (C::Rgb, D::Eight, None),
            (C::Rgb, D::Eight, Some(&[0u8, 1, 0, 1, 0, 1][..])),
            (C::Rgb, D::Sixteen, None),
            (C::Indexed, D::Two, None),
            (C::Indexed, D::Eight, Some(&[0u8, 255][..])),
            (C::Rgba, D::Eight, None),
            (C::Rgba, D::Sixteen, None),
        ] {
            cases.push(("png", tiny_png(color, depth, trns)));
        }
        for (i, (format, bytes)) in cases.iter().enumerate() {
            let probed = Compressed::probe(format, bytes, &Limits::default()).unwrap();
            let d = probed.decode().unwrap();
            let v = d.view();
            assert_eq!(
                (probed.width(), probed.height(), probed.encoding(), probed.step()),
                (v.width(), v.height(), v.encoding(), v.step()),
                "case {i} ({format})"
            );
            assert_eq!(d, decode(format, bytes, &Limits::default()).unwrap(), "case {i}");
        }
        // Progressive is read from the frame header (SOF2).
        let mut progressive = jpeg_bytes(&photo("chelsea.png").to_rgb8().into(), 80);
        let sof = progressive.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        assert!(!Compressed::probe("jpeg", &progressive, &Limits::default())
            .unwrap()
            .progressive());
        progressive[sof + 1] = 0xC2;
        assert!(Compressed::probe("jpeg", &progressive, &Limits::default()).unwrap().progressive());
    }

    #[test]
    fn damaged_data_is_refused_by_cause_never_a_panic() {
        let l = Limits::default();
        let jpeg = jpeg_bytes(&photo("chelsea.png").to_rgb8().into(), 80);
        let png = png_bytes(&photo("chelsea.png").to_rgb8().into());
        // Truncated at several points: inside the headers, inside the data, before the end.
        for (bytes, fmt) in [(&jpeg, "jpeg"), (&png, "png")] {
            for cut in [0, 1, 2, 10, 30, 100, bytes.len() / 2, bytes.len() - 2] {
                let e = decode(fmt, &bytes[..cut], &l).unwrap_err();
                let kinds = ["truncated", "signature", "corrupt"];
                assert!(kinds.contains(&e.kind()), "{fmt} cut at {cut}: {e}");
                if cut > 30 {
                    assert_eq!(e.kind(), "truncated", "{fmt} cut at {cut}: {e}");
                }
            }
        }
        // Flipped bytes anywhere: decoded (entropy data) or a named error, never a panic.
        for (bytes, fmt) in [(&jpeg, "jpeg"), (&png, "png")] {
            for at in (0..bytes.len()).step_by(bytes.len() / 97) {
                let mut b = bytes.clone();
                b[at] ^= 0xFF;
                if let Err(e) = decode(fmt, &b, &l) {
                    assert!(!e.kind().is_empty(), "{e}");
                }
            }
        }
        // The wrong codec for the format.
        let e = decode("jpeg", &png, &l).unwrap_err();
        assert_eq!(e.kind(), "signature", "{e}");
        assert!(e.to_string().contains("PNG's signature"), "{e}");
    }

    /// Rewrite the SOF (JPEG) or IHDR (PNG) size of a valid image.
    fn with_declared_size(bytes: &[u8], width: u32, height: u32) -> Vec<u8> {
        let mut b = bytes.to_vec();
        if b.starts_with(&PNG_SIGNATURE) {
            b[16..20].copy_from_slice(&width.to_be_bytes());
            b[20..24].copy_from_slice(&height.to_be_bytes());
            return b; // The IHDR CRC is now wrong: the limit is checked before it.
        }
        let sof = b.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        b[sof + 5..sof + 7].copy_from_slice(&(height as u16).to_be_bytes());
        b[sof + 7..sof + 9].copy_from_slice(&(width as u16).to_be_bytes());
        b
    }

    #[test]
    fn declared_sizes_over_the_limits_or_zero_are_refused_before_decoding() {
        let l = Limits::default();
        let png = png_bytes(&photo("camera.png").to_luma8().into());
        let e = decode("png", &with_declared_size(&png, 100_000, 100_000), &l).unwrap_err();
        assert!(matches!(e, DecodeError::TooLarge { width: 100_000, height: 100_000, .. }), "{e}");
        assert!(e.to_string().contains("decompression bomb"), "{e}");
        let e = decode("png", &with_declared_size(&png, 0, 5), &l).unwrap_err();
        assert_eq!(e, DecodeError::ZeroSize { width: 0, height: 5 });
        let jpeg = jpeg_bytes(&photo("camera.png").to_luma8().into(), 80);
        let e = decode("jpeg", &with_declared_size(&jpeg, 65535, 65535), &l).unwrap_err();
        assert_eq!(e.kind(), "too_large", "{e}");
        // 9000 x 8000 is under 16384 per side but over 64 Mpx.
        let e = decode("jpeg", &with_declared_size(&jpeg, 9000, 8000), &l).unwrap_err();
        assert_eq!(e.kind(), "too_large", "{e}");
        let e = decode("jpeg", &with_declared_size(&jpeg, 512, 0), &l).unwrap_err();
        assert_eq!(e, DecodeError::ZeroSize { width: 512, height: 0 });
        // A tighter limit refuses a real photograph.
        let small = Limits { max_side: 100, max_pixels: 10_000 };
        assert_eq!(decode("jpeg", &jpeg, &small).unwrap_err().kind(), "too_large");
    }

    #[test]
    fn decode_errors_reach_the_crate_error_and_are_no_device_failure() {
        let e: crate::Error = DecodeError::ZeroSize { width: 0, height: 1 }.into();
        assert!(!e.is_device_failure());
        assert!(e.to_string().starts_with("compressed image: declared size 0x1"), "{e}");
    }
}
