//! The Huffman tables a JPEG may leave out: MJPEG cameras (UVC; usb_cam passes their frames
//! through as `jpeg`) send frames without a DHT segment, and ITU-T T.81 Annex K.3's
//! "typical" tables are then implied. The tables ([`STANDARD_HUFFMAN_TABLES`]), their DHT
//! segment, whether a frame has tables of its own, and the pieces a decoder is given
//! ([`jpeg_pieces`]: the one implementation, for the CPU decoder and the CUDA backend's
//! staging).

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compressed::tests::{jpeg_bytes, photo};
    use crate::compressed::{be16, decode, Limits};

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
}
