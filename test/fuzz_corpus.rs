//! The fuzz corpus as a plain test (stable Rust, no cargo-fuzz): every file of
//! `fuzz/corpus/frame/` goes through the fuzz harness (`fuzz/harness.rs`: message
//! validation + the CPU pipeline, with its properties asserted), plus the findings of the
//! fuzzer as named regression cases; and every file of `fuzz/corpus/video/` through the
//! video packet harness (`fuzz/video_harness.rs`: `video::probe` and its properties). A counting allocator checks that headers claiming
//! gigabytes are rejected without allocating them.

#[path = "../fuzz/harness.rs"]
mod harness;
#[path = "../fuzz/video_harness.rs"]
mod video_harness;

use harness::{Outcome, Settings};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use vision_preproc::wire::msgs::{Header, Image as CdrImage};

/// The system allocator, recording the largest single request.
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds `GlobalAlloc`'s
// contract; the only addition is an atomic store of the requested size.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout, forwarded (see the impl).
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: `ptr`/`layout` come from `System` (see `alloc`), forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// No test of this binary needs more than this in one allocation (the largest valid frame
/// of the harness is 40x40 rgb16 with padding, about 10 KB; the corpus files are < 10 KB).
const ALLOCATION_LIMIT: usize = 64 << 20;

/// The committed corpus, or the folder named by `FUZZ_CORPUS` (to replay a fuzzer's
/// working corpus on stable: `FUZZ_CORPUS=dir cargo test --release --test fuzz_corpus
/// every_corpus_file -- --nocapture` prints what each input did, by field).
fn corpus_dir() -> PathBuf {
    match std::env::var_os("FUZZ_CORPUS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame"),
    }
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir();
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

const FIELDS: &[&str] = &["width", "height", "step", "data", "encoding", "roi"];

#[test]
fn every_corpus_file_runs_clean() {
    let files = corpus();
    let (mut processed, mut rejected, mut cdr_rejected) = (0, 0, 0);
    let mut by_field = std::collections::BTreeMap::<&str, usize>::new();
    let mut panicked = Vec::new();
    for (name, bytes) in &files {
        match std::panic::catch_unwind(|| harness::run(bytes)) {
            Ok(Outcome::Processed { shape }) => {
                assert_eq!(shape[0], 1, "{name}: batch");
                processed += 1;
            }
            Ok(Outcome::Rejected { field, message }) => {
                assert!(message.contains(field), "{name}: `{message}` does not name `{field}`");
                if FIELDS.contains(&field) {
                    rejected += 1;
                } else {
                    // A CDR field of the message (replay's decoder), named in the message.
                    assert!(message.contains(&format!("field `{field}`")), "{name}: {message}");
                    cdr_rejected += 1;
                }
                *by_field.entry(field).or_default() += 1;
            }
            Err(_) => panicked.push(name.clone()),
        }
    }
    println!(
        "{} inputs: {processed} processed, {rejected} rejected, {cdr_rejected} CDR messages \
         rejected; rejections by field: {by_field:?}",
        files.len()
    );
    assert!(panicked.is_empty(), "the harness panicked on {panicked:?} (see the messages above)");
    assert!(files.len() >= 30, "only {} corpus files in {}", files.len(), corpus_dir().display());
    // The corpus covers both sides, else this test could not fail.
    assert!(processed >= 20, "{processed} processed");
    assert!(rejected >= 10, "{rejected} rejected");
    assert!(cdr_rejected >= 1, "{cdr_rejected} CDR messages rejected");
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest < ALLOCATION_LIMIT, "an allocation of {largest} bytes");
}

fn rejected_on(input: &[u8]) -> &'static str {
    match harness::run(input) {
        Outcome::Rejected { field, .. } => field,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Headers whose `step * height` does not fit in 64 bits: before the fix (checked
/// multiplication in `ImageView::with_encoding`) the product wrapped in release builds to
/// the payload's length, the frame was accepted, and decoding row 2^31 of a 13-byte
/// buffer panicked the processing thread (debug builds panicked on the multiplication).
#[test]
fn byte_count_wrapping_64_bits_is_rejected() {
    let s = Settings::default();
    // 2154230017 * 4281516813 * 2 = 2^64 + 26: wraps to 26, / 2 = 13.
    assert_eq!(2154230017u128 * 4281516813 * 2 - (1u128 << 64), 26);
    let mono = harness::raw(&s, (1, 4281516813, 2154230017), "mono8", 0, &[7; 13]);
    assert_eq!(rejected_on(&mono), "step");
    // NV12: step * height * 3 wraps to 2 * 5968.
    assert_eq!(2147587272u128 * 2863173372 * 3 - (1u128 << 64), 2 * 5968);
    let nv12 = harness::raw(&s, (2, 2863173372, 2147587272), "nv12", 0, &[0x80; 5968]);
    assert_eq!(rejected_on(&nv12), "step");
    // rgb16: 6 bytes per pixel, the same wrap with a wider image.
    let rgb16 = harness::raw(&s, (1000, 4281516813, 2154230017), "rgb16", 1, &[1; 13]);
    assert_eq!(rejected_on(&rgb16), "step");
    assert!(LARGEST.load(Ordering::Relaxed) < ALLOCATION_LIMIT);
}

/// Headers claiming gigabytes with a payload of a few bytes: rejected by the header check,
/// nothing near the claimed size is allocated.
#[test]
fn gigabyte_claims_are_rejected_without_allocating() {
    let s = Settings::default();
    // 20000 x 20000 rgb8 = 1.2 GB (fits the 2^31 limit): the data length is wrong.
    let claim = harness::raw(&s, (20000, 20000, 60000), "rgb8", 0, &[1; 16]);
    assert_eq!(rejected_on(&claim), "data");
    // 65535 x 65535 rgb16 = 25.8 GB: over the limit.
    let claim = harness::raw(&s, (65535, 65535, 65535 * 6), "rgb16", 0, &[1; 16]);
    assert_eq!(rejected_on(&claim), "step");
    // u32::MAX everywhere.
    let claim = harness::raw(&s, (u32::MAX, u32::MAX, u32::MAX), "bgra8", 0, &[]);
    assert_eq!(rejected_on(&claim), "step");
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest < ALLOCATION_LIMIT, "an allocation of {largest} bytes");
}

/// Every valid encoding name and alias makes a tensor from a consistent header, in a
/// few configurations (checked against the reference inside the harness).
#[test]
fn every_encoding_is_processed() {
    for enc in &harness::ENCODINGS[..18] {
        for flags in [0x00, 0x3c, 0xc4] {
            let s = Settings { flags, ..Settings::default() };
            let input = harness::consistent(&s, (9, 6, 3), enc, 1, &[3, 200, 17, 99, 255, 0, 128]);
            match harness::run(&input) {
                Outcome::Processed { .. } => {}
                other => panic!("{enc} flags {flags:#x}: {other:?}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// The seed corpus.
// ---------------------------------------------------------------------------------

/// Deterministic pseudo-random bytes (a photograph is not needed to reach the code paths).
fn noise(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// The seeds: every encoding valid (two configurations each), each malformation of the
/// bad-input matrix, rois, conv kernels, and CDR messages (valid and damaged).
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let d = Settings::default();
    for (i, enc) in harness::ENCODINGS[..18].iter().enumerate() {
        let px = noise(97, i as u32);
        out.push((format!("valid-{enc}"), harness::consistent(&d, (17, 12, 0), enc, 0, &px)));
        let s = Settings { flags: 0x3c ^ ((i as u8) << 6), geo: (i as u8) % 3, ..d };
        out.push((
            format!("valid-{enc}-be-nhwc-f16"),
            harness::consistent(&s, (6 + i as u8, 9, 5), enc, 1, &px),
        ));
    }
    let px = noise(64 * 3 * 8, 99);
    // (name, (width, height, step), encoding, data length)
    type Bad = (&'static str, (u32, u32, u32), &'static str, usize);
    let bad: Vec<Bad> = vec![
        ("step-smaller-than-row", (8, 8, 23), "rgb8", 23 * 8),
        ("data-short", (8, 8, 24), "rgb8", 24 * 8 - 1),
        ("data-long", (8, 8, 24), "rgb8", 24 * 8 + 1),
        ("zero-width", (0, 8, 24), "rgb8", 24 * 8),
        ("zero-height", (8, 0, 24), "rgb8", 0),
        ("overflow", (65536, 65536, 196608), "rgb8", 16),
        ("gigabyte-claim", (20000, 20000, 60000), "bgr8", 16),
        ("unknown-encoding", (8, 8, 24), "8UC3", 24 * 8),
        ("empty-encoding", (8, 8, 24), "", 24 * 8),
        ("near-miss-encoding", (8, 8, 24), "RGB8", 24 * 8),
        ("odd-width-yuyv", (7, 8, 14), "yuyv", 14 * 8),
        ("odd-width-uyvy", (7, 8, 14), "uyvy", 14 * 8),
        ("odd-height-nv12", (8, 7, 8), "nv12", 8 * 7 * 3 / 2),
        ("odd-width-nv21", (7, 8, 7), "nv21", 7 * 12),
        ("max-fields", (u32::MAX, u32::MAX, u32::MAX), "mono16", 3),
    ];
    for (name, dims, enc, len) in bad {
        out.push((format!("bad-{name}"), harness::raw(&d, dims, enc, 0, &px[..len.min(px.len())])));
    }
    out.push((
        "bad-wrap-u64-mono8".into(),
        harness::raw(&d, (1, 4281516813, 2154230017), "mono8", 0, &[7; 13]),
    ));
    out.push((
        "bad-wrap-u64-nv12".into(),
        harness::raw(&d, (2, 2863173372, 2147587272), "nv12", 0, &[0x80; 5968]),
    ));
    // Raw headers that are valid: padded step, 1x1, 1xN and Nx1.
    out.push((
        "valid-raw-padded-step".into(),
        harness::raw(&d, (8, 8, 27), "rgb8", 0, &px[..27 * 8]),
    ));
    out.push(("valid-raw-1x1".into(), harness::raw(&d, (1, 1, 1), "bayer_grbg8", 0, &[200])));
    out.push(("valid-raw-1x40".into(), harness::raw(&d, (1, 40, 2), "mono16", 1, &px[..80])));
    out.push(("valid-raw-40x1".into(), harness::raw(&d, (40, 1, 120), "bgr8", 0, &px[..120])));
    // rois: inside (folded into the image) and raw (outside).
    let inside = Settings { geo: 0b0000_1001, roi: [3, 2, 200, 100], ..d };
    out.push(("roi-inside".into(), harness::consistent(&inside, (20, 15, 0), "bgr8", 0, &px)));
    let outside = Settings { geo: 0b0001_0000, roi: [30, 2, 20, 5], ..d };
    out.push(("roi-outside".into(), harness::consistent(&outside, (20, 15, 0), "rgb8", 0, &px)));
    // conv kernels (bits 5-7 of geo) and borders.
    for (k, name) in
        [(3u8, "box"), (4, "gaussian"), (5, "sobel-x"), (6, "laplacian"), (7, "custom")]
    {
        let s = Settings { geo: (k << 5) | 1, border: k, flags: k << 3, ..d };
        out.push((
            format!("conv-{name}"),
            harness::consistent(&s, (k * 5, 11, 1), "rgba8", 0, &px),
        ));
    }
    // One field off by a delta (mode 2): width + 1 (odd for yuyv), data - 1, step - 1.
    for (field, delta, name) in
        [(0u8, 1i32, "width-plus-1"), (3, -1, "data-minus-1"), (2, -1, "step-minus-1")]
    {
        let input = harness::off(&d, (10, 10, 0), "yuyv", 0, (field, delta), &px[..50]);
        out.push((format!("off-{name}"), input));
    }
    // CDR messages: valid, truncated, bad string length, bad encapsulation.
    let header = Header { sec: 1, nanosec: 2, frame_id: "cam".into() };
    let image = CdrImage::packed(header, "bgr8", 6, 4, &px[..72]);
    let msg = image.encode();
    out.push(("cdr-valid".into(), harness::cdr(&d, &msg)));
    out.push(("cdr-truncated".into(), harness::cdr(&d, &msg[..msg.len() - 5])));
    let mut long_string = msg.clone();
    long_string[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    out.push(("cdr-frame-id-length".into(), harness::cdr(&d, &long_string)));
    out.push(("cdr-bad-encapsulation".into(), harness::cdr(&d, &[7, 7, 0, 0, 1, 2, 3])));
    let big = CdrImage { height: 65536, width: 65536, step: 196608, data: &px[..16], ..image };
    out.push(("cdr-gigabyte-claim".into(), harness::cdr(&d, &big.encode())));
    out
}

/// The seeds are what the seed generator writes (a changed input format shows here).
#[test]
fn seed_files_are_up_to_date() {
    let on_disk = corpus();
    for (name, bytes) in seeds() {
        let name = format!("seed-{name}");
        let found = on_disk.iter().find(|(n, _)| *n == name);
        assert_eq!(
            found.map(|(_, b)| b),
            Some(&bytes),
            "{name} differs from fuzz/corpus/frame/: run `cargo test --release --test \
             fuzz_corpus -- --ignored write_seed_corpus`"
        );
    }
}

#[test]
#[ignore = "writes fuzz/corpus/frame/seed-*; run by hand after changing the input format"]
fn write_seed_corpus() {
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seeds() {
        std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    }
}

/// Every file of `fuzz/corpus/video/` through the video packet harness: no panic, the
/// properties of `fuzz/video_harness.rs`, and the seeds' outcomes (real x264enc/x265enc
/// packets of 64x48, and their damaged or mislabelled forms) as named.
#[test]
fn every_video_corpus_file_runs_clean() {
    use video_harness::VideoOutcome::{Accepted, Refused};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/video");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| video_harness::run(&bytes))
            .unwrap_or_else(|_| panic!("{name}: the video harness panicked"));
        let want = match name.as_str() {
            "seed-h264-key" | "seed-h265-key" | "seed-vp9-key" | "seed-av1-seq" => {
                Some(Accepted { key: true })
            }
            // A key frame cut inside its slice data: its headers are whole (the decoder
            // conceals the rest, docs/VIDEO.md).
            "seed-h264-p" | "seed-h265-p" => Some(Accepted { key: false }),
            "seed-h264-key-half" => Some(Accepted { key: true }),
            "seed-h264-labelled-h265" | "seed-h265-labelled-h264" => {
                Some(Refused("not the named codec"))
            }
            "seed-h264-key-cut-in-sps" => Some(Refused("truncated")),
            "seed-h264-16k-sps" => Some(Refused("over the size limits")),
            "seed-h264-avcc" | "seed-garbage" => Some(Refused("not Annex B")),
            "seed-empty" => Some(Refused("empty")),
            _ => None,
        };
        if let Some(want) = want {
            assert_eq!(outcome, want, "{name}");
        }
        seen += 1;
    }
    assert!(seen >= 14, "only {seen} files in {}", dir.display());
    assert!(LARGEST.load(Ordering::Relaxed) < ALLOCATION_LIMIT);
}
