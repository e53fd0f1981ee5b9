//! nvJPEG on the GPU (`backend/cuda/nvjpeg/`) against the CPU specification's decoder
//! (`compressed::decode`: zune-jpeg), on real photographs encoded as JPEG:
//!
//! - every case decoded alone, into a poisoned destination with a padded row pitch: per
//!   class of chroma subsampling (4:2:0, 4:2:2, 4:4:4, grey) the largest |GPU - CPU| of any
//!   sample and the share of samples off by more than 1, within `jpeg_gpu_decode` of
//!   test/tolerances.json (for the product's decoder, chroma interpolated; the same figures
//!   for nvJPEG's default replicated chroma are printed beside them, not checked); the
//!   padding bytes untouched; which decoder took each (the hardware one, or the hybrid
//!   backend and why);
//! - a batch of 4 cameras (different photographs and sizes) in ONE `decode_batch`, equal
//!   byte for byte to the 4 single decodes, 20 times over (a race would move bytes); a
//!   mixed batch (colour, grey, progressive, 4:2:2) likewise;
//! - damaged JPEGs (truncated, header bytes flipped, entropy bytes flipped, a few bytes):
//!   an error or pixels, never a crash (nvJPEG refuses what it cannot parse; the backend's
//!   header check, `Compressed::probe`, refuses the rest but flipped entropy bytes before
//!   nvJPEG sees them), and the good JPEG after each (alone and in a batch) decodes to the
//!   same bytes as before.
//!
//! Cases: the photographs of test/data encoded here by the `image` crate (baseline 4:4:4
//! at quality 50/80/95, and grey), plus every `*.jpg` in `--cases DIR` (OpenCV and Pillow
//! encodes of the same photographs: 4:2:0 at several qualities, 4:2:2, 4:4:4, progressive;
//! scripts/device/make_jpeg_cases.py writes them, scripts/device/gpu_nvjpeg_stage.sh
//! stages them). The class of each case is read from its frame header.
//!
//! A `harness = false` target: without a GPU it prints "no GPU: GPU tests NOT run (not
//! counted as passed)" and exits 0; on a GPU it exits 1 if anything differs or fails.
//! `--quick` (under compute-sanitizer): the backend's decoder only, fewer repetitions.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use vision_preproc::backend::cpu::CpuBackend;
use vision_preproc::backend::cuda::nvjpeg::{
    ChromaUpsampling, DecodeCounts, DecodeItem, NvJpeg, NvJpegOptions, Route,
};
use vision_preproc::backend::cuda::CudaBackend;
use vision_preproc::backend::{Backend, BatchSlot, BatchWork, Frame, FrameWork, PreprocessOp};
use vision_preproc::compressed::{decode, Compressed, Limits};
use vision_preproc::config::MemoryMode;
use vision_preproc::pipeline::{preprocess_op, Geometry};
use vision_preproc::{Config, Encoding, ImageView};

const TOLERANCES: &str = include_str!("tolerances.json");
#[path = "common/photos.rs"]
mod photos;
use photos::PHOTOS;
/// Destination bytes before a decode: anything not written stays this.
const POISON: u8 = 0xA5;
/// Extra bytes per row of every destination: the decoder must honour the pitch.
const PITCH_PAD: usize = 64;

/// One JPEG to test.
struct Case {
    name: String,
    jpeg: Vec<u8>,
}

/// The CPU decode of a case.
struct Expected {
    width: u32,
    height: u32,
    grey: bool,
    pixels: Vec<u8>,
}

fn expected(case: &Case) -> Result<Expected, String> {
    let d = decode("jpeg", &case.jpeg, &Limits::default()).map_err(|e| e.to_string())?;
    let v = d.view();
    let grey = match v.encoding() {
        Encoding::Mono8 => true,
        Encoding::Rgb8 => false,
        e => return Err(format!("CPU decode gave {e:?}")),
    };
    Ok(Expected { width: v.width(), height: v.height(), grey, pixels: v.data().to_vec() })
}

/// The chroma subsampling class of a JPEG, from its frame header (component 0's sampling
/// factors; the chroma components are 1x1 in every file here).
fn class(jpeg: &[u8]) -> String {
    let mut pos = 2;
    while pos + 4 <= jpeg.len() {
        if jpeg[pos] != 0xFF {
            return "unknown".into();
        }
        let marker = jpeg[pos + 1];
        let len = usize::from(u16::from_be_bytes([jpeg[pos + 2], jpeg[pos + 3]]));
        if matches!(marker, 0xC0..=0xC2) {
            let seg = &jpeg[pos + 4..(pos + 2 + len).min(jpeg.len())];
            if seg.len() < 8 {
                return "unknown".into();
            }
            if seg[5] == 1 {
                return "grey".into();
            }
            return match (seg[7] >> 4, seg[7] & 15) {
                (1, 1) => "colour_444",
                (2, 1) => "colour_422",
                (2, 2) => "colour_420",
                _ => "unknown",
            }
            .into();
        }
        pos += 2 + len;
    }
    "unknown".into()
}

/// Largest |a - b| and the count of samples with |a - b| > 1.
fn diff(a: &[u8], b: &[u8]) -> (u8, usize) {
    a.iter().zip(b).fold((0, 0), |(m, n), (&x, &y)| {
        let d = x.abs_diff(y);
        (m.max(d), n + usize::from(d > 1))
    })
}

/// A poisoned device destination for `e` with padded rows.
struct Dst {
    buf: CudaSlice<u8>,
    pitch: usize,
    row: usize,
    height: usize,
}

impl Dst {
    fn new(stream: &Arc<CudaStream>, e: &Expected) -> Dst {
        let row = e.width as usize * if e.grey { 1 } else { 3 };
        let pitch = row + PITCH_PAD;
        let height = e.height as usize;
        let buf = stream.clone_htod(&vec![POISON; pitch * height]).expect("device alloc");
        Dst { buf, pitch, row, height }
    }

    fn item<'a>(&self, stream: &CudaStream, jpeg: &'a [u8], e: &Expected) -> DecodeItem<'a> {
        let (ptr, _sync) = self.buf.device_ptr(stream);
        DecodeItem {
            jpeg,
            width: e.width,
            height: e.height,
            grey: e.grey,
            dst: ptr,
            pitch: self.pitch,
        }
    }

    /// The rows without padding, and whether every padding byte is still the poison.
    fn read(&self, stream: &Arc<CudaStream>) -> (Vec<u8>, bool) {
        let all = stream.clone_dtoh(&self.buf).expect("download");
        let mut pixels = Vec::with_capacity(self.row * self.height);
        let mut pad_ok = true;
        for r in 0..self.height {
            let line = &all[r * self.pitch..(r + 1) * self.pitch];
            pixels.extend_from_slice(&line[..self.row]);
            pad_ok &= line[self.row..].iter().all(|&b| b == POISON);
        }
        (pixels, pad_ok)
    }
}

/// The pixels of each item of a set, the route of each, and whether every padding byte
/// stayed poisoned; or the error.
type Decoded = Result<(Vec<Vec<u8>>, Vec<Route>, bool), String>;

/// Decode `cases` (with their CPU decodes) in one `decode_batch` into fresh poisoned
/// destinations; the pixels of each, or the error.
fn decode_set(nv: &mut NvJpeg, stream: &Arc<CudaStream>, cases: &[(&[u8], &Expected)]) -> Decoded {
    let dsts: Vec<Dst> = cases.iter().map(|(_, e)| Dst::new(stream, e)).collect();
    let items: Vec<DecodeItem> =
        cases.iter().zip(&dsts).map(|((j, e), d)| d.item(stream, j, e)).collect();
    // SAFETY: every destination holds pitch * height bytes and the JPEGs live until the
    // stream is synchronized below, before either is touched or dropped.
    let report = unsafe { nv.decode_batch(stream, &items) };
    stream.synchronize().map_err(|e| format!("stream: {e:?}"))?;
    let report = report.map_err(|e| e.to_string())?;
    let mut pads = true;
    let pixels = dsts
        .iter()
        .map(|d| {
            let (p, ok) = d.read(stream);
            pads &= ok;
            p
        })
        .collect();
    Ok((pixels, report.routes, pads))
}

fn encode_image_crate(rgb: &image::DynamicImage, quality: u8, grey: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality);
    if grey {
        enc.encode_image(&rgb.to_luma8()).expect("jpeg encode");
    } else {
        enc.encode_image(&rgb.to_rgb8()).expect("jpeg encode");
    }
    out
}

fn gpu_present() -> bool {
    // SAFETY: only tries to dlopen libcuda.
    let lib = unsafe { cudarc::driver::sys::is_culib_present() };
    lib && cudarc::driver::result::init().is_ok()
        && cudarc::driver::result::device::get_count().is_ok_and(|n| n > 0)
}

#[derive(Default)]
struct Worst {
    max_abs: u8,
    share: f64,
    cases: usize,
}

/// The damaged JPEGs of part 3 (`damaged_case`), by name.
const DAMAGES: [&str; 6] = [
    "truncated to half",
    "truncated to 10 bytes",
    "empty",
    "header bytes flipped",
    "entropy bytes flipped",
    "frame header says 0x0",
];

/// What a named check runs.
enum Kind {
    /// Part 1: the case alone, against the CPU decoder.
    Decode(usize),
    /// Part 2: "4 cameras" or "mixed".
    Batch(&'static str),
    /// Part 3: one of [`DAMAGES`].
    Damaged(&'static str),
    /// Part 4: the CUDA backend on compressed frames in one memory mode.
    Backend(MemoryMode),
}

/// A named check: `--list` prints the names, `--filter TEXT` runs those containing TEXT.
struct Check {
    name: String,
    kind: Kind,
}

fn checks(cases: &[Case]) -> Vec<Check> {
    let mut all: Vec<Check> = (cases.iter().enumerate())
        .map(|(i, c)| Check { name: format!("decode {}", c.name), kind: Kind::Decode(i) })
        .collect();
    for label in ["4 cameras", "mixed"] {
        all.push(Check { name: format!("batch {label}"), kind: Kind::Batch(label) });
    }
    for what in DAMAGES {
        all.push(Check { name: format!("damaged {what}"), kind: Kind::Damaged(what) });
    }
    for mode in [MemoryMode::Upload, MemoryMode::Mapped] {
        all.push(Check { name: format!("backend {mode:?}"), kind: Kind::Backend(mode) });
    }
    all
}

/// The JPEG cases: the photographs encoded by the image crate, then `--cases DIR`'s.
fn jpeg_cases(dir: Option<&str>) -> Vec<Case> {
    let mut cases = Vec::new();
    for (name, bytes) in PHOTOS {
        let img = image::load_from_memory(bytes).expect("photograph");
        let grey_photo = name == "camera";
        for q in [50u8, 80, 95] {
            cases.push(Case {
                name: format!("{name}_image-crate_q{q}{}", if grey_photo { "_grey" } else { "" }),
                jpeg: encode_image_crate(&img, q, grey_photo),
            });
        }
        if !grey_photo {
            cases.push(Case {
                name: format!("{name}_image-crate_q80_grey"),
                jpeg: encode_image_crate(&img, 80, true),
            });
        }
    }
    if let Some(dir) = dir {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("--cases {dir}: {e}"))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jpg"))
            .collect();
        files.sort();
        for f in files {
            let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            cases.push(Case { name, jpeg: std::fs::read(&f).expect("case file") });
        }
    }
    cases
}

/// What the checks share.
struct Ctx<'a> {
    nv: NvJpeg,
    /// The other decoders part 1 compares (none with `--quick`).
    others: Vec<(&'static str, NvJpeg)>,
    stream: Arc<CudaStream>,
    cases: &'a [Case],
    /// The CPU decode of each case.
    expect: Vec<Result<Expected, String>>,
    /// `jpeg_gpu_decode` of test/tolerances.json.
    tol: &'a serde_json::Value,
    worst: BTreeMap<(String, String), Worst>,
    quick: bool,
    /// Whether `--cases DIR` was given (the mixed batch needs its files).
    have_dir: bool,
}

impl Ctx<'_> {
    fn index(&self, prefix: &str) -> Option<usize> {
        self.cases
            .iter()
            .position(|c| c.name.starts_with(prefix))
            .filter(|&i| self.expect[i].is_ok())
    }
    /// 4 cameras: OpenCV's 4:2:0 (what cameras and image_transport send) when the cases
    /// directory is there, else the image crate's encodes.
    fn four(&self) -> Vec<usize> {
        let pick =
            |names: [&str; 4]| names.iter().filter_map(|p| self.index(p)).collect::<Vec<usize>>();
        let mut four = pick([
            "cv2_astronaut_q80_420",
            "cv2_chelsea_q80_420",
            "cv2_coffee_q80_420",
            "cv2_rocket_q80_420",
        ]);
        if four.len() < 4 {
            four = pick([
                "astronaut_image-crate_q80",
                "chelsea_image-crate_q80",
                "coffee_image-crate_q80",
                "rocket_image-crate_q80",
            ]);
        }
        four
    }
}

/// Part 1: case `i` alone, against the CPU decoder, by every decoder.
fn decode_case(cx: &mut Ctx<'_>, i: usize, failures: &mut Vec<String>) {
    let case = &cx.cases[i];
    let e = match &cx.expect[i] {
        Ok(e) => e,
        Err(err) => {
            failures.push(format!("{}: CPU decode: {err}", case.name));
            return;
        }
    };
    let (tol, stream, worst) = (cx.tol, &cx.stream, &mut cx.worst);
    let (nv, others) = (&mut cx.nv, &mut cx.others);
    let class = class(&case.jpeg);
    let samples = e.pixels.len();
    let mut line = format!("{:<40} {:>9} {}x{}", case.name, class, e.width, e.height);
    let decoders =
        std::iter::once(("interpolated", &mut *nv)).chain(others.iter_mut().map(|(l, n)| (*l, n)));
    for (label, dec) in decoders {
        match decode_set(dec, stream, &[(&case.jpeg, e)]) {
            Ok((px, routes, pads)) => {
                let (m, over) = diff(&px[0], &e.pixels);
                let share = over as f64 / samples as f64;
                line += &format!("  {label}: {:?} max {m} >1 {:.3}%", routes[0], share * 100.0);
                let w = worst.entry((label.to_string(), class.clone())).or_default();
                (w.max_abs, w.share, w.cases) = (w.max_abs.max(m), w.share.max(share), w.cases + 1);
                if !pads {
                    failures.push(format!("{} ({label}): a padding byte was written", case.name));
                }
                if label == "interpolated" {
                    let t = &tol[class.as_str()];
                    let (tm, ts) = (t["max_abs"].as_u64(), t["share_over_1"].as_f64());
                    match (tm, ts) {
                        (Some(tm), Some(ts)) if u64::from(m) <= tm && share <= ts => {}
                        (Some(tm), Some(ts)) => failures.push(format!(
                            "{} ({class}): max |GPU - CPU| {m} (tolerance {tm}), share > 1 \
                                 {share:.5} (tolerance {ts})",
                            case.name
                        )),
                        _ => failures
                            .push(format!("tolerances.json: jpeg_gpu_decode.{class} missing")),
                    }
                }
            }
            Err(err) => failures.push(format!("{} ({label}): {err}", case.name)),
        }
    }
    println!("{line}");
}

/// Part 2: a batch of 4 cameras, or a mixed batch, against the single decodes.
fn batch_case(cx: &mut Ctx<'_>, label: &str, failures: &mut Vec<String>) {
    let ids = if label == "4 cameras" {
        cx.four()
    } else {
        [
            "cv2_astronaut_q90_420",
            "camera_image-crate_q80_grey",
            "cv2_coffee_q90_progressive",
            "cv2_chelsea_q90_422",
        ]
        .iter()
        .filter_map(|p| cx.index(p))
        .collect()
    };
    let (cases, expect, stream, nv) = (cx.cases, &cx.expect, &cx.stream, &mut cx.nv);
    let singles = |nv: &mut NvJpeg, ids: &[usize]| -> Result<Vec<Vec<u8>>, String> {
        ids.iter()
            .map(|&i| {
                let e = expect[i].as_ref().map_err(|_| "no CPU decode")?;
                decode_set(nv, stream, &[(&cases[i].jpeg, e)]).map(|(p, ..)| p[0].clone())
            })
            .collect()
    };
    let repeats = if cx.quick { 2 } else { 20 };
    let ids = &ids;
    if ids.len() < 4 {
        if label == "4 cameras" || cx.have_dir {
            failures.push(format!("batch {label}: only {} of its 4 cases exist", ids.len()));
        }
        return;
    }
    let single = match singles(nv, ids) {
        Ok(s) => s,
        Err(e) => {
            failures.push(format!("batch {label}: single decodes: {e}"));
            return;
        }
    };
    let set: Vec<(&[u8], &Expected)> = ids
        .iter()
        .filter_map(|&i| expect[i].as_ref().ok().map(|e| (cases[i].jpeg.as_slice(), e)))
        .collect();
    let mut ok = 0;
    for r in 0..repeats {
        match decode_set(nv, stream, &set) {
            Ok((px, routes, pads)) => {
                if r == 0 {
                    println!("batch {label}: routes {routes:?}");
                }
                let same = px == single && pads;
                ok += usize::from(same);
                if !same {
                    failures
                        .push(format!("batch {label}, run {r}: differs from the single decodes"));
                }
            }
            Err(e) => failures.push(format!("batch {label}, run {r}: {e}")),
        }
    }
    println!("batch {label}: {ok}/{repeats} runs equal to the 4 single decodes byte for byte");
}

/// Part 3: a damaged JPEG (`what`, of [`DAMAGES`]), then the good one again.
fn damaged_case(cx: &mut Ctx<'_>, what: &str, failures: &mut Vec<String>) {
    let Some(g) = cx.four().first().copied() else {
        return;
    };
    let Ok(ge) = cx.expect[g].as_ref() else {
        return;
    };
    let (good, stream, nv) = (&cx.cases[g].jpeg, &cx.stream, &mut cx.nv);
    let reference = decode_set(nv, stream, &[(good, ge)]).map(|(p, ..)| p[0].clone());
    let mut damaged: Vec<(&str, Vec<u8>)> = vec![
        ("truncated to half", good[..good.len() / 2].to_vec()),
        ("truncated to 10 bytes", good[..10].to_vec()),
        ("empty", Vec::new()),
    ];
    let mut header = good.clone();
    for b in &mut header[2..40] {
        *b ^= 0x5A;
    }
    damaged.push(("header bytes flipped", header));
    let mut entropy = good.clone();
    let n = entropy.len();
    for k in 0..64 {
        entropy[n / 3 + k * (n / 200)] ^= 0xFF;
    }
    damaged.push(("entropy bytes flipped", entropy));
    let mut sof = good.clone();
    if let Some(p) = sof.windows(2).position(|w| w == [0xFF, 0xC0]) {
        sof[p + 5..p + 9].copy_from_slice(&[0, 0, 0, 0]); // height 0, width 0
        damaged.push(("frame header says 0x0", sof));
    }
    for (what, bad) in damaged.iter().filter(|(w, _)| *w == what) {
        let alone = decode_set(nv, stream, &[(bad, ge)]);
        let batch = decode_set(nv, stream, &[(good, ge), (bad, ge), (good, ge)]);
        let again = decode_set(nv, stream, &[(good, ge)]).map(|(p, ..)| p[0].clone());
        let again_batch = decode_set(nv, stream, &[(good, ge), (good, ge)]);
        let outcome = |r: &Decoded| match r {
            Ok(_) => "decoded (pixels)".to_string(),
            Err(e) => format!("error: {e}"),
        };
        println!("damaged, {what}: alone {}; in a batch {}", outcome(&alone), outcome(&batch));
        let good_again = again.as_ref().ok() == reference.as_ref().ok() && reference.is_ok();
        let batch_again = again_batch
            .as_ref()
            .is_ok_and(|(p, ..)| reference.as_ref().is_ok_and(|r| p.iter().all(|x| x == r)));
        if !good_again || !batch_again {
            failures.push(format!(
                "after the damaged JPEG ({what}) the good one decodes differently or fails \
                     (alone: {good_again}, in a batch: {batch_again})"
            ));
        }
        // nvJPEG itself refuses these; the others it may decode to pixels (it skips
        // bytes up to the next marker, fills a cut scan), so the backend checks every
        // header first (`Compressed::probe`, as the CPU decoder does), which refuses
        // each damaged JPEG here but the flipped entropy bytes.
        let must_fail =
            matches!(*what, "truncated to 10 bytes" | "empty" | "frame header says 0x0");
        if must_fail && alone.is_ok() {
            failures.push(format!("damaged ({what}): decoded without an error"));
        }
        let probe = Compressed::probe("jpeg", bad, &Limits::default());
        if (*what == "entropy bytes flipped") == probe.is_err() {
            failures.push(format!("damaged ({what}): the header check says {probe:?}"));
        }
    }
}

/// The JPEG cases, every named check (`--list`, `--filter TEXT`: those whose name
/// contains TEXT; warm-up always runs first, as the node does); a failure prints its
/// check's name and the command that reruns it alone.
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let arg =
        |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let filter = arg("--filter").unwrap_or_default();
    let dir = arg("--cases");
    let list = args.iter().any(|a| a == "--list");
    if !list && !gpu_present() {
        println!("no GPU: GPU tests NOT run (not counted as passed)");
        return ExitCode::SUCCESS;
    }
    let cases = jpeg_cases(dir.as_deref());
    let all = checks(&cases);
    let selected: Vec<&Check> = all.iter().filter(|c| c.name.contains(&filter)).collect();
    if list {
        for c in &selected {
            println!("{}", c.name);
        }
        return ExitCode::SUCCESS;
    }
    let tol: serde_json::Value = serde_json::from_str(TOLERANCES).expect("tolerances.json");
    let tol = &tol["jpeg_gpu_decode"];
    let mut failures: Vec<String> = Vec::new();
    let ctx = CudaContext::new(0).expect("CUDA context");
    let stream = ctx.new_stream().expect("stream");
    let mut nv = match NvJpeg::open(&ctx) {
        Ok(n) => n,
        Err(e) => {
            println!("FAIL: NvJpeg::open: {e}");
            return ExitCode::FAILURE;
        }
    };
    let replicated = NvJpeg::open_with(
        &ctx,
        NvJpegOptions { upsampling: ChromaUpsampling::Replicated, ..Default::default() },
    );
    let hybrid_only =
        NvJpeg::open_with(&ctx, NvJpegOptions { hardware: false, ..Default::default() });
    println!("gpu_nvjpeg: {} cases on {}", cases.len(), ctx.name().unwrap_or_default());
    println!("decoder: {}", nv.describe());
    // What the node does at start for 4 compressed cameras: every case and batch below
    // then decodes on states the warm-up made, and the warm-up is no decoded frame.
    match nv.warm_up(&stream, 4) {
        Ok(()) if nv.counts() == &DecodeCounts::default() => {
            println!("warm_up(4): {}", nv.summary())
        }
        Ok(()) => failures.push(format!("warm_up counted frames: {:?}", nv.counts())),
        Err(e) => failures.push(format!("warm_up(4): {e}")),
    }
    let mut others: Vec<(&str, NvJpeg)> = Vec::new();
    // --quick (under compute-sanitizer): the backend's decoder only (its hybrid backend
    // still decodes the progressive cases and the mixed batch's).
    let extra =
        if quick { vec![] } else { vec![("replicated", replicated), ("hybrid-only", hybrid_only)] };
    for (label, n) in extra {
        match n {
            Ok(n) => {
                println!("also ({label}): {}", n.describe());
                others.push((label, n));
            }
            Err(e) => failures.push(format!("opening the {label} decoder: {e}")),
        }
    }
    let expect = cases.iter().map(expected).collect();
    let mut cx = Ctx {
        nv,
        others,
        stream,
        cases: &cases,
        expect,
        tol,
        worst: BTreeMap::new(),
        quick,
        have_dir: dir.is_some(),
    };
    let rerun = format!(
        "{}{}{} --filter",
        args[0],
        dir.as_ref().map(|d| format!(" --cases {d}")).unwrap_or_default(),
        if quick { " --quick" } else { "" }
    );
    for f in &failures {
        println!("FAIL setup (warm-up, decoders): {f}");
    }
    for check in selected {
        let mut failed = Vec::new();
        match check.kind {
            Kind::Decode(i) => decode_case(&mut cx, i, &mut failed),
            Kind::Batch(label) => batch_case(&mut cx, label, &mut failed),
            Kind::Damaged(what) => damaged_case(&mut cx, what, &mut failed),
            Kind::Backend(mode) => backend_parity(&mut cx, mode, &mut failed),
        }
        for f in &failed {
            println!("FAIL {}: {f}", check.name);
        }
        if !failed.is_empty() {
            println!("     rerun it alone: {rerun} '{}'", check.name);
        }
        failures.extend(failed);
    }
    if !cx.worst.is_empty() {
        println!(
            "\nworst per decoder and class (max |GPU - CPU|, largest share of samples off by > 1):"
        );
        for ((label, class), w) in &cx.worst {
            println!(
                "  {label:<13} {class:<11} max_abs {:>3}  share_over_1 {:.5}  ({} cases)",
                w.max_abs, w.share, w.cases
            );
        }
    }
    println!("\ncounts: {:?}", cx.nv.counts());
    for f in &failures {
        println!("FAIL: {f}");
    }
    println!("gpu_nvjpeg summary: {} cases, {} failures", cases.len(), failures.len());
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `jpeg` without its DHT segments (what MJPEG cameras send).
fn without_huffman_tables(jpeg: &[u8]) -> Vec<u8> {
    let (mut out, mut pos) = (jpeg[..2].to_vec(), 2);
    while jpeg[pos + 1] != 0xDA {
        let len = 2 + usize::from(u16::from_be_bytes([jpeg[pos + 2], jpeg[pos + 3]]));
        if jpeg[pos + 1] != 0xC4 {
            out.extend_from_slice(&jpeg[pos..pos + len]);
        }
        pos += len;
    }
    out.extend_from_slice(&jpeg[pos..]);
    out
}

/// The JPEG frames the backend's hardware decoder decoded so far (its diagnostics).
fn hardware_decoded(gpu: &CudaBackend) -> Option<u64> {
    gpu.diagnostics()
        .into_iter()
        .find_map(|(_, v)| v.split("decoded: ").nth(1)?.split(' ').next()?.parse().ok())
}

/// The float32 elements of a tensor.
fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// The operation of the default configuration (640x480 letterbox, float32) for `frame`.
fn op_for(frame: Frame<'_, '_>) -> PreprocessOp {
    let cfg = Config::default();
    let g = Geometry::resolve(&cfg, frame.width(), frame.height()).expect("geometry");
    let mut op = preprocess_op(&cfg, &g);
    op.params.set_source(frame);
    op
}

/// What the backend checks share.
struct Env<'a> {
    cases: &'a [Case],
    /// `jpeg_gpu_decode` of test/tolerances.json.
    tol: &'a serde_json::Value,
    f32_abs: f64,
    mode: MemoryMode,
    quick: bool,
}

/// Part 4: the CUDA backend on compressed frames, in memory mode `mode`: (a) equal bit
/// for bit to the same backend on the pixels nvJPEG gives alone (the decode lands where
/// the upload would have put them, in the layout the kernel reads), (b) within
/// `jpeg_gpu_decode` (in output units: levels x the largest |scale|, + float32_abs) of
/// the CPU backend on the same compressed frames; decode_us > 0; a batch of 4 cameras
/// and a mixed batch (JPEG, progressive JPEG, a PNG the backend decodes on the host, raw
/// pixels) equal to their single frames; an MJPEG frame without Huffman tables.
fn backend_parity(cx: &mut Ctx<'_>, mode: MemoryMode, failures: &mut Vec<String>) {
    let (cases, tol, nv, stream) = (cx.cases, cx.tol, &mut cx.nv, &cx.stream);
    let by_name = |n: &str| cases.iter().position(|c| c.name == n);
    let ids: Vec<usize> = [
        "cv2_astronaut_q80_420",
        "cv2_chelsea_q90_422",
        "cv2_coffee_q90_444",
        "cv2_rocket_q90_progressive",
        "cv2_camera_q80_grey",
        "mosaic_1080p_q90",
        "chelsea_image-crate_q80",
    ]
    .iter()
    .filter_map(|n| by_name(n))
    .collect();
    let ids = &ids;
    let all: serde_json::Value = serde_json::from_str(TOLERANCES).expect("tolerances.json");
    let f32_abs = all["float32_abs"].as_f64().expect("float32_abs");
    let probes: Vec<(usize, Compressed)> = ids
        .iter()
        .filter_map(|&i| {
            Compressed::probe("jpeg", &cases[i].jpeg, &Limits::default()).ok().map(|c| (i, c))
        })
        .collect();
    if probes.len() != ids.len() {
        failures.push(format!("backend: {} of {} cases probe", probes.len(), ids.len()));
    }
    // Each case's pixels as nvJPEG gives them alone (tight rows).
    let mut alone: Vec<Vec<u8>> = Vec::new();
    for (i, c) in &probes {
        let e = expected(&cases[*i]).expect("CPU decode");
        match decode_set(nv, stream, &[(&cases[*i].jpeg, &e)]) {
            Ok((px, ..)) => alone.push(px[0].clone()),
            Err(err) => {
                failures.push(format!("backend: {}: nvJPEG alone: {err}", cases[*i].name));
                return;
            }
        }
        assert_eq!(c.step() as usize * c.height() as usize, alone.last().map_or(0, Vec::len));
    }
    let mut cpu = CpuBackend::new();
    let mut gpu = match CudaBackend::new(0, mode) {
        Ok(b) => b,
        Err(e) => {
            failures.push(format!("backend ({mode:?}): opening: {e}"));
            return;
        }
    };
    gpu.set_poison_outputs(true);
    println!("\nbackend ({mode:?}): {}", gpu.device_description());
    let env = Env { cases, tol, f32_abs, mode, quick: cx.quick };
    let singles = backend_singles(&mut gpu, &mut cpu, &env, &probes, &alone, failures);
    backend_batches(&mut gpu, &mut cpu, &env, &probes, &singles, failures);
    backend_mjpeg(&mut gpu, &env, &probes, &singles, failures);
    for (key, value) in gpu.diagnostics() {
        if key.starts_with("Compressed") {
            println!("backend ({mode:?}) {key}: {value}");
        }
    }
}

/// Part 4 (a) and (b): each case through the backend alone; its tensors.
fn backend_singles(
    gpu: &mut CudaBackend,
    cpu: &mut CpuBackend,
    env: &Env<'_>,
    probes: &[(usize, Compressed)],
    alone: &[Vec<u8>],
    failures: &mut Vec<String>,
) -> Vec<Vec<u8>> {
    let Env { cases, tol, f32_abs, mode, .. } = *env;
    let mut singles: Vec<Vec<u8>> = Vec::new();
    for ((i, c), px) in probes.iter().zip(alone) {
        let name = &cases[*i].name;
        let op = op_for(Frame::Compressed(c));
        let (mut out, mut via_pixels, mut reference) = (Vec::new(), Vec::new(), Vec::new());
        let view =
            ImageView::with_encoding(c.width(), c.height(), c.step(), c.encoding(), false, px)
                .expect("decoded view");
        let times = match (
            gpu.process(FrameWork::new(c, &op, None), &mut out),
            gpu.process(FrameWork::new(&view, &op, None), &mut via_pixels),
            cpu.process(FrameWork::new(c, &op, None), &mut reference),
        ) {
            (Ok(t), Ok(_), Ok(_)) => t,
            (a, b, c) => {
                failures.push(format!(
                    "backend ({mode:?}) {name}: {:?} / {:?} / {:?}",
                    a.err(),
                    b.err(),
                    c.err()
                ));
                continue;
            }
        };
        let levels = tol[class(&cases[*i].jpeg).as_str()]["max_abs"].as_f64().unwrap_or(0.0);
        let scale = op.params.scale.iter().fold(0.0f64, |m, s| m.max(f64::from(s.abs())));
        let bound = levels * scale + f32_abs;
        let (g, r) = (floats(&out), floats(&reference));
        let max = g.iter().zip(&r).fold(0.0f64, |m, (a, b)| m.max(f64::from((a - b).abs())));
        let nan = g.iter().any(|v| !v.is_finite());
        let exact = out == via_pixels;
        println!(
                "backend ({mode:?}) {name:<30} exact vs nvJPEG pixels: {exact}; max |cuda - cpu| \
                 {max:.3e} (bound {bound:.3e}); decode_us {:.0}, upload_us {:.0}, preprocess_us {:.0}",
                times.decode_us, times.upload_us, times.preprocess_us
            );
        if !exact || nan || max > bound || times.decode_us <= 0.0 {
            failures.push(format!(
                "backend ({mode:?}) {name}: exact {exact}, NaN {nan}, max {max:.3e} > {bound:.3e} \
                     or decode_us {}",
                times.decode_us
            ));
        }
        singles.push(out);
    }
    singles
}

/// Part 4: a batch of 4 cameras (the first four cases), then a mixed one (JPEG,
/// progressive JPEG, a PNG the backend decodes on the host, raw pixels), equal to their
/// single frames and within the bound of the CPU backend's.
fn backend_batches(
    gpu: &mut CudaBackend,
    cpu: &mut CpuBackend,
    env: &Env<'_>,
    probes: &[(usize, Compressed)],
    singles: &[Vec<u8>],
    failures: &mut Vec<String>,
) {
    let Env { tol, f32_abs, mode, quick, .. } = *env;
    let png = {
        let img = image::load_from_memory(PHOTOS[1].1).expect("photograph");
        let mut out = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png).expect("png");
        out
    };
    let png = Compressed::probe("png", &png, &Limits::default()).expect("png probe");
    let raw = image::load_from_memory(PHOTOS[0].1).expect("photograph").to_rgb8();
    let raw = ImageView::with_encoding(
        raw.width(),
        raw.height(),
        raw.width() * 3,
        Encoding::Rgb8,
        false,
        raw.as_raw(),
    )
    .expect("raw view");
    let mut batches: Vec<(&str, Vec<(Frame, usize)>)> = Vec::new();
    if probes.len() >= 4 {
        batches.push(("4 cameras", (0..4).map(|k| (Frame::Compressed(&probes[k].1), k)).collect()));
        batches.push((
            "mixed",
            vec![
                (Frame::Compressed(&probes[3].1), 3),
                (Frame::Compressed(&png), usize::MAX),
                (Frame::Pixels(&raw), usize::MAX),
                (Frame::Compressed(&probes[0].1), 0),
            ],
        ));
    }
    let repeats = if quick { 1 } else { 5 };
    // The largest tolerance of any class (the batches mix them).
    let worst_levels = ["colour_420", "colour_422", "colour_444", "grey"]
        .iter()
        .filter_map(|k| tol[*k]["max_abs"].as_f64())
        .fold(0.0, f64::max);
    for (label, frames) in &batches {
        let ops: Vec<PreprocessOp> = frames.iter().map(|(f, _)| op_for(*f)).collect();
        let slots: Vec<BatchSlot> =
            frames.iter().zip(&ops).map(|((f, _), op)| BatchSlot::frame(*f, op)).collect();
        for run in 0..repeats {
            let mut out = Vec::new();
            let mut cpu_out = Vec::new();
            let len: usize = ops.iter().map(|o| o.params.tensor_desc().byte_len()).sum();
            out.resize(len, 0);
            cpu_out.resize(len, 0);
            let r = gpu.process_batch_into(BatchWork::new(&slots, None), &mut out);
            let rc = cpu.process_batch_into(BatchWork::new(&slots, None), &mut cpu_out);
            match (r, rc) {
                (Ok(t), Ok(_)) => {
                    let item = len / frames.len();
                    let mut ok = true;
                    for (k, (_, single)) in frames.iter().enumerate() {
                        let got = &out[k * item..(k + 1) * item];
                        if *single != usize::MAX && got != singles[*single].as_slice() {
                            ok = false;
                        }
                    }
                    let max = floats(&out)
                        .iter()
                        .zip(floats(&cpu_out))
                        .fold(0.0f64, |m, (a, b)| m.max(f64::from((a - b).abs())));
                    if run == 0 {
                        println!(
                                "backend ({mode:?}) batch {label}: JPEG items equal to their single frames: {ok}; max |cuda - cpu| {max:.3e}; decode_us {:.0}",
                                t.decode_us
                            );
                    }
                    let scale = ops
                        .iter()
                        .flat_map(|o| o.params.scale)
                        .fold(0.0f64, |m, s| m.max(f64::from(s.abs())));
                    let bound = worst_levels * scale + f32_abs;
                    if !ok || max > bound || t.decode_us <= 0.0 {
                        failures.push(format!("backend ({mode:?}) batch {label}, run {run}: equal {ok}, max {max:.3e}, decode_us {}", t.decode_us));
                    }
                }
                (a, b) => failures.push(format!(
                    "backend ({mode:?}) batch {label}: {:?} / {:?}",
                    a.err(),
                    b.err()
                )),
            }
        }
    }
}

/// Part 4: an MJPEG frame without its Huffman tables.
fn backend_mjpeg(
    gpu: &mut CudaBackend,
    env: &Env<'_>,
    probes: &[(usize, Compressed)],
    singles: &[Vec<u8>],
    failures: &mut Vec<String>,
) {
    let Env { cases, mode, .. } = *env;
    // An MJPEG camera's frame (its Huffman tables left out): decoded on the device with
    // the standard tables put in (the image crate's encoder writes those), its tensor
    // bit-equal to the same JPEG's with its tables.
    let chelsea = probes.iter().position(|(i, _)| cases[*i].name == "chelsea_image-crate_q80");
    if let Some((k, with_tables)) = chelsea.and_then(|k| singles.get(k).map(|t| (k, t))) {
        let mjpeg = without_huffman_tables(&cases[probes[k].0].jpeg);
        let before = hardware_decoded(gpu);
        let mut out = Vec::new();
        let r = Compressed::probe("jpeg", &mjpeg, &Limits::default())
            .map_err(|e| e.to_string())
            .and_then(|c| {
                let op = op_for(Frame::Compressed(&c));
                gpu.process(FrameWork::new(&c, &op, None), &mut out).map_err(|e| e.to_string())
            });
        let after = hardware_decoded(gpu);
        let on_device = before.is_some() && after == before.map(|n| n + 1);
        let equal = r.is_ok() && &out == with_tables;
        println!(
            "backend ({mode:?}) MJPEG frame without Huffman tables: decoded by the hardware \
                 decoder {on_device} ({before:?} -> {after:?}); tensor equal to the JPEG's with \
                 its tables: {equal}"
        );
        if !(on_device && equal) {
            failures.push(format!(
                "backend ({mode:?}) MJPEG without Huffman tables: {r:?}, on the device \
                     {on_device}, equal {equal}"
            ));
        }
    } else {
        failures.push("backend: chelsea_image-crate_q80 missing for the MJPEG check".into());
    }
}
