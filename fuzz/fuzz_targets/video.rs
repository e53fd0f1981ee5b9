//! Fuzz target: one video packet (the codec its message names, then its bytes) through
//! `vision_preproc::video::probe`, the check every packet of a video input passes before a
//! decoder sees it. The input format and every property checked are in
//! `fuzz/video_harness.rs` (shared with `test/fuzz_corpus.rs`).
#![no_main]

#[path = "../video_harness.rs"]
mod video_harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = video_harness::run(data);
});
