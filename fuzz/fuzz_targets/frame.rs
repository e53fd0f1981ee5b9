//! Fuzz target: one `sensor_msgs/Image` (raw header fields, consistent headers with one
//! field off, or a CDR message as `replay` reads it) through `ImageView::new` and the CPU
//! `Pipeline::process`, under a small configuration chosen by the input. The input format
//! and every property checked are in `fuzz/harness.rs` (shared with `test/fuzz_corpus.rs`).
#![no_main]

// The seed builders of the harness are used by the corpus test only.
#[allow(dead_code)]
#[path = "../harness.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;
use std::sync::Once;

static POOL: Once = Once::new();

fuzz_target!(|data: &[u8]| {
    // Rayon runs on this thread alone: tensors here are at most 24x24, so handing each
    // band to another thread and back would cost more than the work.
    POOL.call_once(|| {
        let _ = rayon::ThreadPoolBuilder::new().num_threads(1).use_current_thread().build_global();
    });
    let _ = harness::run(data);
});
