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

use std::fmt;
use std::io::Cursor;

use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use crate::image::{Encoding, ImageError, ImageView};

/// The compression of a payload, from its `format` string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// JPEG (baseline, extended sequential or progressive; Huffman coded; 8-bit).
    Jpeg,
    /// PNG (any colour type and bit depth; interlaced or not).
    Png,
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Codec::Jpeg => "JPEG",
            Codec::Png => "PNG",
        })
    }
}

/// The `format` strings we accept, for error messages (one source: [`Format::parse`]
/// accepts exactly these shapes).
pub const ACCEPTED_FORMATS: &str = "`jpeg`, `png` (usb_cam and other drivers' pass-through), \
    `<enc>; jpeg compressed <enc2>`, `<enc>; png compressed <enc2>` or `<enc>; png compressed` \
    (image_transport's compressed publisher, e.g. `bgr8; jpeg compressed bgr8`, \
    `16UC1; png compressed`)";

/// A parsed `sensor_msgs/CompressedImage.format`: the codec, and for image_transport's
/// compressed publisher the encoding of the original `sensor_msgs/Image` (`<enc>`) and the
/// one it was converted to before compression (`<enc2>`, absent for some 16-bit PNGs).
///
/// The two encodings are informative only: what the decoder returns depends on the
/// compressed data (JPEG stores YCbCr, so `rgb8; jpeg compressed bgr8` decodes to RGB like
/// any other colour JPEG; a grey JPEG or PNG to mono8/mono16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    /// JPEG or PNG.
    pub codec: Codec,
    /// `<enc>`: the publisher's input encoding (`bgr8`, `16UC1`, ...), if given.
    pub source_encoding: Option<String>,
    /// `<enc2>`: what the publisher converted to before compressing (`bgr8`, `mono8`).
    pub compressed_encoding: Option<String>,
}

impl Format {
    /// Parse a `format` string (exact words, as the publishers write them; surrounding
    /// white space ignored). `compressedDepth` (compressed_depth_image_transport: a header
    /// of depth quantization before the PNG) is refused by name.
    pub fn parse(format: &str) -> Result<Format, DecodeError> {
        let unknown = || DecodeError::UnknownFormat(format.to_string());
        let codec = |word: &str| match word {
            "jpeg" => Some(Codec::Jpeg),
            "png" => Some(Codec::Png),
            _ => None,
        };
        let Some((source, rest)) = format.split_once(';') else {
            let codec = codec(format.trim()).ok_or_else(unknown)?;
            return Ok(Format { codec, source_encoding: None, compressed_encoding: None });
        };
        let source = source.trim();
        if source.is_empty() || source.contains(char::is_whitespace) {
            return Err(unknown());
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        let (codec, target) = match words.as_slice() {
            [c, "compressed"] => (codec(c).ok_or_else(unknown)?, None),
            [c, "compressed", target] => (codec(c).ok_or_else(unknown)?, Some(*target)),
            _ => return Err(unknown()),
        };
        Ok(Format {
            codec,
            source_encoding: Some(source.to_string()),
            compressed_encoding: target.map(str::to_string),
        })
    }
}

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

/// What a JPEG's frame header (SOFn) declares.
#[derive(Debug)]
struct JpegHeader {
    /// The SOF marker's second byte (0xC0 baseline, 0xC2 progressive, ...).
    marker: u8,
    precision: u8,
    width: u32,
    height: u32,
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
    let truncated =
        |detail: String| DecodeError::Truncated { codec: Codec::Jpeg, detail, len: data.len() };
    let corrupt = |message: String| DecodeError::Corrupt { codec: Codec::Jpeg, message };
    if !data.starts_with(&[0xFF, 0xD8]) {
        return Err(DecodeError::Signature { expected: Codec::Jpeg, found: describe_start(data) });
    }
    let mut header: Option<JpegHeader> = None;
    let mut adobe_transform = None;
    let mut has_dht = false;
    let mut pos = 2;
    loop {
        if pos >= data.len() {
            return Err(truncated(format!("the data ends at byte {pos}, inside the headers")));
        }
        if data[pos] != 0xFF {
            return Err(corrupt(format!(
                "expected a marker at byte {pos}, found 0x{:02X}",
                data[pos]
            )));
        }
        // Fill bytes (0xFF) may precede a marker.
        while pos < data.len() && data[pos] == 0xFF {
            pos += 1;
        }
        let Some(&marker) = data.get(pos) else {
            return Err(truncated(format!("the data ends at byte {pos}, inside a marker")));
        };
        pos += 1;
        match marker {
            // TEM and RSTn have no segment.
            0x01 | 0xD0..=0xD7 => continue,
            0xD8 => {
                return Err(corrupt(format!("a second start-of-image marker at byte {}", pos - 2)))
            }
            0xD9 => return Err(corrupt("end-of-image before any frame header or scan".into())),
            _ => {}
        }
        if pos + 2 > data.len() {
            return Err(truncated(format!(
                "the data ends at byte {pos}, inside marker 0x{marker:02X}'s length"
            )));
        }
        let len = usize::from(be16(data, pos));
        if len < 2 {
            return Err(corrupt(format!(
                "marker 0x{marker:02X} at byte {} has length {len}",
                pos - 2
            )));
        }
        if pos + len > data.len() {
            return Err(truncated(format!(
                "marker 0x{marker:02X}'s segment at byte {pos} needs {len} bytes"
            )));
        }
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

/// The Huffman tables of ITU-T T.81 Annex K.3 (the "typical" ones every MJPEG decoder
/// implies when a frame has none): per table, its class and id (`Tc << 4 | Th`), the
/// number of codes of each length 1..=16, and the symbols in code order.
const STANDARD_HUFFMAN_TABLES: [(u8, [u8; 16], &[u8]); 4] = [
    // K.3.1, luminance DC (Table K.3).
    (
        0x00,
        [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
        &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    ),
    // K.3.2, luminance AC (Table K.5).
    (
        0x10,
        [0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7D],
        &[
            0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21, 0x31, 0x41, 0x06, 0x13, 0x51,
            0x61, 0x07, 0x22, 0x71, 0x14, 0x32, 0x81, 0x91, 0xA1, 0x08, 0x23, 0x42, 0xB1, 0xC1,
            0x15, 0x52, 0xD1, 0xF0, 0x24, 0x33, 0x62, 0x72, 0x82, 0x09, 0x0A, 0x16, 0x17, 0x18,
            0x19, 0x1A, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39,
            0x3A, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4A, 0x53, 0x54, 0x55, 0x56, 0x57,
            0x58, 0x59, 0x5A, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6A, 0x73, 0x74, 0x75,
            0x76, 0x77, 0x78, 0x79, 0x7A, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x92,
            0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7,
            0xA8, 0xA9, 0xAA, 0xB2, 0xB3, 0xB4, 0xB5, 0xB6, 0xB7, 0xB8, 0xB9, 0xBA, 0xC2, 0xC3,
            0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8,
            0xD9, 0xDA, 0xE1, 0xE2, 0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEA, 0xF1, 0xF2,
            0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8, 0xF9, 0xFA,
        ],
    ),
    // K.3.1, chrominance DC (Table K.4).
    (
        0x01,
        [0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
        &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    ),
    // K.3.2, chrominance AC (Table K.6).
    (
        0x11,
        [0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 0x77],
        &[
            0x00, 0x01, 0x02, 0x03, 0x11, 0x04, 0x05, 0x21, 0x31, 0x06, 0x12, 0x41, 0x51, 0x07,
            0x61, 0x71, 0x13, 0x22, 0x32, 0x81, 0x08, 0x14, 0x42, 0x91, 0xA1, 0xB1, 0xC1, 0x09,
            0x23, 0x33, 0x52, 0xF0, 0x15, 0x62, 0x72, 0xD1, 0x0A, 0x16, 0x24, 0x34, 0xE1, 0x25,
            0xF1, 0x17, 0x18, 0x19, 0x1A, 0x26, 0x27, 0x28, 0x29, 0x2A, 0x35, 0x36, 0x37, 0x38,
            0x39, 0x3A, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4A, 0x53, 0x54, 0x55, 0x56,
            0x57, 0x58, 0x59, 0x5A, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6A, 0x73, 0x74,
            0x75, 0x76, 0x77, 0x78, 0x79, 0x7A, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89,
            0x8A, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0xA2, 0xA3, 0xA4, 0xA5,
            0xA6, 0xA7, 0xA8, 0xA9, 0xAA, 0xB2, 0xB3, 0xB4, 0xB5, 0xB6, 0xB7, 0xB8, 0xB9, 0xBA,
            0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6,
            0xD7, 0xD8, 0xD9, 0xDA, 0xE2, 0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEA, 0xF2,
            0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8, 0xF9, 0xFA,
        ],
    ),
];

/// One DHT segment (marker, length, the four tables) with [`STANDARD_HUFFMAN_TABLES`].
pub(crate) fn standard_huffman_segment() -> &'static [u8] {
    static SEGMENT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    SEGMENT.get_or_init(|| {
        let mut tables = Vec::new();
        for (class_id, counts, symbols) in STANDARD_HUFFMAN_TABLES {
            tables.push(class_id);
            tables.extend_from_slice(&counts);
            tables.extend_from_slice(symbols);
        }
        let len = u16::try_from(tables.len() + 2).unwrap_or(u16::MAX);
        [&[0xFF, 0xC4][..], &len.to_be_bytes(), &tables].concat()
    })
}

/// Whether a JPEG defines Huffman tables (a DHT segment) before its first scan. MJPEG
/// cameras (UVC; usb_cam passes their frames through as `jpeg`) may leave them out: the
/// standard's (T.81 K.3) are then implied, and both backends' decoders are given a copy
/// with them ([`with_standard_huffman_tables`]).
pub(crate) fn has_huffman_tables(jpeg: &[u8]) -> bool {
    let mut pos = 2;
    while pos + 4 <= jpeg.len() && jpeg[pos] == 0xFF {
        match jpeg[pos + 1] {
            // A fill byte before a marker.
            0xFF => pos += 1,
            0xC4 => return true,
            0xDA => return false,
            // TEM, RSTn: no segment.
            0x01 | 0xD0..=0xD7 => pos += 2,
            _ => pos += 2 + usize::from(u16::from_be_bytes([jpeg[pos + 2], jpeg[pos + 3]])),
        }
    }
    false
}

/// The pieces of the JPEG a decoder is given: `jpeg` itself, or, without Huffman tables,
/// its SOI, the standard tables' DHT segment, and the rest (the one implementation of the
/// implied tables, for the CPU decoder and for the CUDA backend's staging, which copies
/// the pieces into its pinned buffer without a copy in between).
pub(crate) fn jpeg_pieces(jpeg: &[u8]) -> [&[u8]; 3] {
    if jpeg.len() < 2 || has_huffman_tables(jpeg) {
        [jpeg, &[], &[]]
    } else {
        [&jpeg[..2], standard_huffman_segment(), &jpeg[2..]]
    }
}

/// `jpeg` with the standard Huffman tables when it has none ([`jpeg_pieces`]).
pub(crate) fn with_standard_huffman_tables(jpeg: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    match jpeg_pieces(jpeg) {
        [whole, [], []] => std::borrow::Cow::Borrowed(whole),
        pieces => std::borrow::Cow::Owned(pieces.concat()),
    }
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
fn checked_jpeg_header(
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

fn decode_jpeg(data: &[u8], limits: &Limits) -> Result<Decoded, DecodeError> {
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

/// The eight bytes every PNG starts with.
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

/// What a PNG's IHDR declares, and whether a tRNS chunk (transparency, which the
/// expansion turns into an alpha channel) is present.
#[derive(Debug, Clone, Copy)]
struct PngHeader {
    width: u32,
    height: u32,
    bit_depth: u8,
    color_type: u8,
    transparency: bool,
}

impl PngHeader {
    /// The encoding [`decode_png`] gives: palette and 1/2/4-bit grey expanded to 8 bits,
    /// tRNS to alpha; alpha kept only for 8-bit RGBA (see the module's notes).
    fn encoding(&self) -> Result<Encoding, DecodeError> {
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
fn png_header(data: &[u8]) -> Result<PngHeader, DecodeError> {
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
fn decode_png(data: &[u8], limits: &Limits, expected: Encoding) -> Result<Decoded, DecodeError> {
    use png::{BitDepth, ColorType};
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
    // (channels stored, channels kept, encoding)
    let (stored, kept, encoding) = match (info.color_type, sixteen) {
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
                message: format!("{other:?} at {:?} after expansion", info.bit_depth),
            })
        }
    };
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
    use image::{ImageEncoder, ImageFormat};

    fn photo(name: &str) -> image::DynamicImage {
        let path = format!("{}/test/data/{name}", env!("CARGO_MANIFEST_DIR"));
        image::open(&path).unwrap()
    }

    fn png_bytes(img: &image::DynamicImage) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    }

    fn jpeg_bytes(img: &image::DynamicImage, quality: u8) -> Vec<u8> {
        let mut out = Vec::new();
        let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality);
        enc.write_image(img.as_bytes(), img.width(), img.height(), img.color().into()).unwrap();
        out
    }

    #[test]
    fn parses_the_publishers_format_strings() {
        let f = Format::parse("bgr8; jpeg compressed bgr8").unwrap();
        assert_eq!(f.codec, Codec::Jpeg);
        assert_eq!(f.source_encoding.as_deref(), Some("bgr8"));
        assert_eq!(f.compressed_encoding.as_deref(), Some("bgr8"));
        let f = Format::parse("16UC1; png compressed").unwrap();
        assert_eq!((f.codec, f.compressed_encoding), (Codec::Png, None));
        for ok in [
            "jpeg",
            "png",
            "rgb8; jpeg compressed bgr8",
            "mono8; jpeg compressed mono8",
            "bgr8; png compressed bgr8",
            "mono16; png compressed",
            "mono16; png compressed mono16",
        ] {
            assert!(Format::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "JPEG",
            "jpg",
            "h264",
            "16UC1; compressedDepth png",
            "16UC1; compressedDepth",
            "; jpeg compressed bgr8",
            "bgr8; jpeg",
            "bgr8; tiff compressed bgr8",
            "bgr8; jpeg compressed bgr8 extra",
        ] {
            let e = Format::parse(bad).unwrap_err();
            assert_eq!(e, DecodeError::UnknownFormat(bad.into()));
            assert!(e.to_string().contains("`<enc>; jpeg compressed <enc2>`"), "{e}");
        }
    }

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

    /// A 4x2 PNG written by the png crate with `color`, `depth`, optional palette and tRNS.
    fn tiny_png(color: png::ColorType, depth: png::BitDepth, trns: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, 4, 2);
        enc.set_color(color);
        enc.set_depth(depth);
        if color == png::ColorType::Indexed {
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
        use png::{BitDepth as D, ColorType as C};
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

    /// `bytes` without its DHT segments (what MJPEG cameras send).
    fn without_huffman_tables(bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes[..2].to_vec();
        let mut pos = 2;
        while bytes[pos + 1] != 0xDA {
            let len = usize::from(be16(bytes, pos + 2));
            if bytes[pos + 1] != 0xC4 {
                out.extend_from_slice(&bytes[pos..pos + 2 + len]);
            }
            pos += 2 + len;
        }
        out.extend_from_slice(&bytes[pos..]);
        out
    }

    /// The tables of every DHT segment of `jpeg` before its first scan, concatenated.
    fn huffman_tables_of(jpeg: &[u8]) -> Vec<u8> {
        let (mut tables, mut pos) = (Vec::new(), 2);
        while jpeg[pos + 1] != 0xDA {
            let len = usize::from(be16(jpeg, pos + 2));
            if jpeg[pos + 1] == 0xC4 {
                tables.extend_from_slice(&jpeg[pos + 4..pos + 2 + len]);
            }
            pos += 2 + len;
        }
        tables
    }

    #[test]
    fn the_standard_huffman_tables_are_the_ones_encoders_write() {
        // The image crate's encoder writes T.81 K.3's tables (as libjpeg does by default):
        // our segment holds the same bytes, in the same order, and a frame without tables
        // is told apart and gets them after its SOI.
        let jpeg = jpeg_bytes(&photo("chelsea.png").to_rgb8().into(), 80);
        let segment = standard_huffman_segment();
        assert_eq!(
            (segment[..2].to_vec(), be16(segment, 2) as usize),
            (vec![0xFF, 0xC4], segment.len() - 2)
        );
        assert_eq!(huffman_tables_of(&jpeg), segment[4..].to_vec());
        let mjpeg = without_huffman_tables(&jpeg);
        assert!(has_huffman_tables(&jpeg) && !has_huffman_tables(&mjpeg));
        assert!(!has_huffman_tables(&[0xFF, 0xD8]) && !has_huffman_tables(&[]));
        let fixed = with_standard_huffman_tables(&mjpeg);
        assert_eq!(fixed.len(), mjpeg.len() + segment.len());
        assert_eq!((&fixed[..2], &fixed[2..2 + segment.len()]), (&mjpeg[..2], segment));
        assert!(matches!(with_standard_huffman_tables(&jpeg), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn mjpeg_frames_without_huffman_tables_use_the_standard_ones() {
        // The image crate's encoder writes the standard (K.3) tables, so dropping them
        // changes nothing once they are implied again.
        let jpeg = jpeg_bytes(&photo("chelsea.png").to_rgb8().into(), 80);
        let mjpeg = without_huffman_tables(&jpeg);
        assert!(mjpeg.len() < jpeg.len());
        let l = Limits::default();
        assert_eq!(decode("jpeg", &mjpeg, &l).unwrap(), decode("jpeg", &jpeg, &l).unwrap());
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

    #[test]
    fn decode_errors_reach_the_crate_error_and_are_no_device_failure() {
        let e: crate::Error = DecodeError::ZeroSize { width: 0, height: 1 }.into();
        assert!(!e.is_device_failure());
        assert!(e.to_string().starts_with("compressed image: declared size 0x1"), "{e}");
    }
}
