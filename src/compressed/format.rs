//! The `format` string of a `sensor_msgs/CompressedImage`: its codec ([`Codec`]) and, from
//! image_transport's compressed publisher, the two encodings it names ([`Format::parse`]);
//! [`ACCEPTED_FORMATS`] lists the shapes it takes, for the error messages.

use std::fmt;

use super::DecodeError;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
