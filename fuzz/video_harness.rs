//! The fuzz harness of video packets (`vision_preproc::video::probe`), shared by the
//! cargo-fuzz target (`fuzz/fuzz_targets/video.rs`) and the corpus test
//! (`test/fuzz_corpus.rs`, every file of `fuzz/corpus/video/`).
//!
//! Byte layout: `[0] % 4` the codec the message names (h264, h265, vp9, av1); the rest is
//! the packet.
//!
//! What holds for every input, or [`run`] panics (a finding):
//! - `probe` returns (no panic, no allocation beyond a few times the packet).
//! - A refusal's kind is one of `PacketError::kind`'s and its message names the codec or
//!   the fix.
//! - An accepted packet's size, when its SPS gave one, is within `Limits::default()`.
//! - H.264/H.265: every parameter set handed back starts with a 4-byte start code and
//!   is bytes of the packet; `key` only when an independent scan of the packet finds an
//!   IDR (H.264 type 5) or IRAP (H.265 types 16-21) NAL unit header after a start code.

use vision_preproc::compressed::Limits;
use vision_preproc::video::{probe, Codec, PacketError};

/// What one input did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VideoOutcome {
    /// Accepted: a key frame or not.
    Accepted { key: bool },
    /// Refused, by kind.
    Refused(&'static str),
}

/// The kinds `PacketError::kind` can give.
const KINDS: &[&str] =
    &["empty", "not Annex B", "not the named codec", "truncated", "over the size limits"];

/// An independent scan: does the packet hold a key frame's NAL unit header after a start
/// code?
fn has_key_nal(codec: Codec, data: &[u8]) -> bool {
    data.windows(4).any(|w| {
        w[..3] == [0, 0, 1]
            && match codec {
                Codec::H264 => w[3] & 0x1f == 5,
                _ => (16..=21).contains(&((w[3] >> 1) & 0x3f)),
            }
    })
}

/// Run one input through the probe and check its properties.
pub fn run(input: &[u8]) -> VideoOutcome {
    let Some((&selector, data)) = input.split_first() else {
        return VideoOutcome::Refused("empty");
    };
    let codec = Codec::ALL[usize::from(selector) % Codec::ALL.len()];
    match probe(codec, data, &Limits::default()) {
        Err(e) => {
            assert!(KINDS.contains(&e.kind()), "{codec}: unknown kind {}", e.kind());
            if !matches!(e, PacketError::Empty) {
                assert!(e.to_string().contains(codec.name()), "{codec}: message {e}");
            }
            VideoOutcome::Refused(e.kind())
        }
        Ok(p) => {
            let limits = Limits::default();
            if let Some((w, h)) = p.size {
                assert!(w <= limits.max_side && h <= limits.max_side, "{codec}: {w}x{h} accepted");
                assert!(u64::from(w) * u64::from(h) <= limits.max_pixels, "{codec}: {w}x{h}");
            }
            if matches!(codec, Codec::H264 | Codec::H265) {
                assert!(p.parameter_sets.len() <= data.len() + 4 * data.len().div_ceil(3));
                if !p.parameter_sets.is_empty() {
                    assert_eq!(p.parameter_sets[..4], [0, 0, 0, 1], "{codec}");
                }
                if p.key {
                    assert!(has_key_nal(codec, data), "{codec}: key without an IDR/IRAP header");
                }
            }
            VideoOutcome::Accepted { key: p.key }
        }
    }
}
