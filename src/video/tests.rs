//! The packet probe on real parameter sets: each SPS below is what Debian 12's GStreamer
//! 1.22 encoders wrote for one black `videotestsrc` frame
//! (`videotestsrc num-buffers=1 pattern=black ! video/x-raw,width=W,height=H,format=I420 !
//! x264enc | x265enc ! h264parse | h265parse ! video/x-h26N,stream-format=byte-stream`),
//! its NAL unit as hex.

use super::*;

/// x264enc, 320x240 (High profile: chroma format and scaling list flags are read).
const H264_320X240: &str = "67640014acd94141fb016a0c0c0d4a000003000200000300791e28532c";
/// x264enc, 1920x1080 (coded 1920x1088, cropped by 8 rows).
const H264_1080P: &str = "67640028acd940780227e5c05a808080a0000003002000000791e30632c0";
/// x264enc speed-preset=ultrafast, 15360x8640 (16K; Constrained Baseline).
const H264_16K: &str = "6742c03eda003c000439b016a0202028000003000800000301e478402150";
/// x265enc, 320x240.
const H265_320X240: &str = "42010101600000030090000003000003003fa00a080f165959a4932bffc00040005a830303020000030002000003003c10";
/// x265enc, 1920x1080 (coded 1920x1088, its conformance window crops 8 rows).
const H265_1080P: &str = "420101016000000300900000030000030078a003c08010e596566924cafff000100016a020202080000003008000000f04";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// `nals` as one Annex B access unit (4-byte start codes).
fn annex_b(nals: &[Vec<u8>]) -> Vec<u8> {
    nals.iter().flat_map(|n| [0u8, 0, 0, 1].into_iter().chain(n.iter().copied())).collect()
}

#[test]
fn sps_sizes_of_real_encoders() {
    let limits = Limits::default();
    for (codec, sps, size) in [
        (Codec::H264, H264_320X240, (320, 240)),
        (Codec::H264, H264_1080P, (1920, 1080)),
        (Codec::H265, H265_320X240, (320, 240)),
        (Codec::H265, H265_1080P, (1920, 1080)),
    ] {
        let p = probe(codec, &annex_b(&[hex(sps)]), &limits).unwrap();
        assert_eq!(p.size, Some(size), "{codec} {sps}");
        assert!(p.has_sps && !p.key && !p.parameter_sets.is_empty(), "{codec}");
    }
}

#[test]
fn a_16k_stream_is_over_the_limits_by_its_sps() {
    let e = probe(Codec::H264, &annex_b(&[hex(H264_16K)]), &Limits::default()).unwrap_err();
    assert_eq!(e.kind(), "over the size limits");
    assert!(e.to_string().contains("15360x8640"), "{e}");
}

#[test]
fn key_frames_are_idr_and_irap() {
    let limits = Limits::default();
    // H.264: an IDR slice (type 5) after SPS and PPS; a P slice (type 1) alone.
    let idr = annex_b(&[hex(H264_320X240), vec![0x68, 0xeb, 0xe3, 0xcb], vec![0x65, 0x88, 0x84]]);
    let p = probe(Codec::H264, &idr, &limits).unwrap();
    assert!(p.key && p.has_sps);
    assert_eq!(p.parameter_sets.len(), 4 + 29 + 4 + 4);
    assert!(!probe(Codec::H264, &annex_b(&[vec![0x41, 0x9a, 0x02]]), &limits).unwrap().key);
    // H.265: IDR_W_RADL (19) is a key frame, TRAIL_R (1) is not.
    assert!(probe(Codec::H265, &annex_b(&[vec![0x26, 0x01, 0xaf]]), &limits).unwrap().key);
    assert!(!probe(Codec::H265, &annex_b(&[vec![0x02, 0x01, 0xd0]]), &limits).unwrap().key);
}

#[test]
fn bad_packets_are_refused_by_cause() {
    let limits = Limits::default();
    let kind = |codec, data: &[u8]| probe(codec, data, &limits).unwrap_err().kind();
    assert_eq!(kind(Codec::H264, &[]), "empty");
    // An AVCC packet (a 4-byte length, not a start code).
    assert_eq!(kind(Codec::H264, &[0, 0, 0, 5, 0x65, 1, 2, 3, 4]), "not Annex B");
    // H.264 bytes sent as h265 (SPS 0x67: H.265 type 51) and H.265 as h264 (VPS 0x40:
    // H.264 type 0).
    assert_eq!(kind(Codec::H265, &annex_b(&[hex(H264_320X240)])), "not the named codec");
    assert_eq!(kind(Codec::H264, &annex_b(&[hex(H265_320X240)])), "not the named codec");
    // An SPS cut short, and a NAL unit that is a header only.
    let sps = hex(H264_1080P);
    assert_eq!(kind(Codec::H264, &annex_b(&[sps[..8].to_vec()])), "truncated");
    assert_eq!(kind(Codec::H264, &[0, 0, 1, 0x65]), "truncated");
    // VP9's frame marker and AV1's forbidden bit.
    assert_eq!(kind(Codec::Vp9, &[0x00, 0x01]), "not the named codec");
    assert_eq!(kind(Codec::Av1, &[0x80, 0x00]), "not the named codec");
}

#[test]
fn vp9_and_av1_key_frames() {
    let limits = Limits::default();
    // VP9 profile 0: 10 0 0 0 0 ...: frame_type 0 (key); 10 0 0 0 1: a non-key frame.
    assert!(probe(Codec::Vp9, &[0x80, 0x49, 0x83], &limits).unwrap().key);
    assert!(!probe(Codec::Vp9, &[0x84, 0x00], &limits).unwrap().key);
    // AV1: a temporal delimiter (type 2, size 0) then a sequence header (type 1, 2 bytes).
    let tu = [0x12, 0x00, 0x0a, 0x02, 0x00, 0x00];
    assert!(probe(Codec::Av1, &tu, &limits).unwrap().key);
    assert!(!probe(Codec::Av1, &tu[..2], &limits).unwrap().key);
    assert_eq!(probe(Codec::Av1, &[0x0a, 0x05, 0x00], &limits).unwrap_err().kind(), "truncated");
}

#[test]
fn codec_names_of_every_publisher() {
    for (s, c) in [
        ("h264", Codec::H264),
        ("H264", Codec::H264),
        ("hevc;yuv420p;bgr8;bgr8", Codec::H265),
        ("libx264", Codec::H264),
        ("hevc_nvenc", Codec::H265),
        ("h265", Codec::H265),
        ("vp9", Codec::Vp9),
        ("av1", Codec::Av1),
    ] {
        assert_eq!(Codec::from_format(s), Some(c), "{s}");
    }
    assert_eq!(Codec::from_format("jpeg"), None);
    assert_eq!(Codec::from_format(""), None);
}
