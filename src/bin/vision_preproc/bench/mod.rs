//! `vision_preproc bench` (cargo feature `bench`, off in the product): the CUDA backend's
//! fused kernel against the three-kernel path it replaces, the tiled conv2d against a
//! naive one, upload, download and the full frame, each timed with CUDA events (warm-up,
//! then `iterations` timed runs; mean, p50, p99), with the bytes of the ledger, achieved
//! GB/s, the percentage of a device-to-device copy measured in the same run, occupancy
//! and registers from the driver, the SM clock measured during the run, and the time the
//! ledger predicts on a Jetson Orin Nano at 68 and 31 GB/s. Prints a table and writes
//! `results.json`; with `--startup`, measures the start-up cost instead.
//!
//! Inputs are random (never zeros) and rotate over enough buffer sets that each timed
//! run reads memory the previous runs did not leave in L2 (footprint >= 4x L2). It uses
//! the backend's public API only: the parts a frame runs on (`CudaBackend::stream`,
//! `fused_kernel`, `conv_launch`, ...), launched with `launch_kernel!`.

mod baselines;
pub mod decode;
mod figures;
mod report;
mod startup;
mod timing;

use anyhow::{Context, Result};
use baselines::Baselines;
use figures::{Case, ConvPlanes};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};
use timing::Bench;
use vision_preproc::backend::cuda::CudaBackend;
use vision_preproc::config::MemoryMode;
use vision_preproc::rng::SplitMix64;

/// Benchmark settings.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// CUDA device ordinal.
    pub device_id: u32,
    /// Timed iterations per figure (the issue asks for >= 1000).
    pub iterations: u32,
    /// Untimed iterations first.
    pub warmup: u32,
    /// Also time compile-time variants of the fused kernel ([`FUSED_VARIANTS`]) and its
    /// one-block-per-tile launch.
    pub variants: bool,
    /// Frame size cases to run, by index (0: 1280x720, 1: 1920x1200, 2: 4K); empty: all.
    pub cases: Vec<usize>,
    /// conv2d kernel sizes to time (tiled, naive, separable); empty: no conv2d figures.
    pub conv_sizes: Vec<u32>,
    /// Read each case's frame from `DIR/case<i>.raw` (exactly width x height x 3 bytes)
    /// instead of random bytes, and write the backend's tensor for it (with the frame
    /// conv2d) to `DIR/case<i>.tensor` (little-endian float32 NCHW), so another program
    /// can process the same bytes and compare.
    pub frames_dir: Option<std::path::PathBuf>,
    /// Gaussian conv2d size (`cv2.getGaussianKernel(k, 0)`, zero border) applied after
    /// the fused kernel in the "GPU frame" and "full frame" figures; 0: none.
    pub frame_conv: u32,
}

/// Compile-time variants of the fused kernel the benchmark can time beside the default
/// (direct path, span loads for rgb8/bgr8/rgba8/bgra8): (label, extra NVRTC options,
/// staged path). `kernels/resize_normalize.cu` holds one, the staged path the backend can
/// select; the kernel lab (`bench/klab/`) builds and times the others.
pub const FUSED_VARIANTS: [(&str, &[&str], bool); 1] =
    [("variant staged (RN_STAGED=1)", &["-DRN_STAGED=1"], true)];

/// What [`bench`] produced: the full results (written to results.json) and a table.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// Everything, machine-readable.
    pub json: serde_json::Value,
    /// The human-readable table, with the targets' verdicts.
    pub table: String,
}

/// Run the whole benchmark on device `opts.device_id`: the copy roof, then per frame
/// size case every figure of [`figures`], then the conv2d figures.
pub fn bench(opts: &BenchOptions) -> vision_preproc::Result<BenchReport> {
    let started = SystemTime::now();
    let mut backend = CudaBackend::new(opts.device_id, MemoryMode::Upload)?;
    let dev = backend.device().clone();
    let bl = Baselines::load(&backend)?;
    let clock_before = bl.measure_clock(&backend)?;
    let mut rng = SplitMix64::new(
        started.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7),
    );
    let mut bench = Bench {
        b: &mut backend,
        warmup: opts.warmup as usize,
        iters: opts.iterations.max(1) as usize,
        roof_gbps: 1.0,
        figures: Vec::new(),
        notes: Vec::new(),
    };
    figures::copy_roof(&mut bench, &mut rng)?;
    let mut ledgers = Vec::new();
    for (index, sc) in figures::size_cases().into_iter().enumerate() {
        if !opts.cases.is_empty() && !opts.cases.contains(&index) {
            continue;
        }
        let case = Case::prepare(&mut bench, index, sc, opts, &mut rng)?;
        let fused = figures::fused(&mut bench, &case)?;
        if opts.variants {
            figures::fused_one_block_per_tile(&mut bench, &case)?;
            figures::fused_variants(&mut bench, &case)?;
        }
        figures::three_kernel(&mut bench, &case, &bl, fused)?;
        let host = figures::upload_download(&mut bench, &case)?;
        figures::gpu_frame(&mut bench, &case, &host)?;
        drop(host);
        ledgers.push(case.ledger_json());
        figures::full_frame(&mut bench, &case, opts)?;
    }
    if !opts.conv_sizes.is_empty() {
        let planes = ConvPlanes::new(&bench, &mut rng)?;
        for &k in &opts.conv_sizes {
            figures::conv2d(&mut bench, &bl, &planes, k, &mut rng)?;
        }
    }
    let clock_after = bl.measure_clock(bench.b)?;
    let verdicts = report::verdicts(&bench.figures);
    let run = report::Run {
        dev: &dev,
        started,
        clock_mhz: (clock_before, clock_after),
        roof_gbps: bench.roof_gbps,
        figures: &bench.figures,
        notes: &bench.notes,
        verdicts: &verdicts,
        ledgers: &ledgers,
    };
    Ok(BenchReport { json: report::json(&run, opts), table: report::table(&run, opts) })
}

/// Arguments of `vision_preproc bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: u32,
    /// Timed iterations per figure.
    #[arg(long, default_value_t = 1000)]
    pub iterations: u32,
    /// Untimed warm-up iterations per figure.
    #[arg(long, default_value_t = 50)]
    pub warmup: u32,
    /// Where to write the full results.
    #[arg(long, default_value = "results.json")]
    pub out: PathBuf,
    /// Also time compile-time variants of the fused kernel and its direct path.
    #[arg(long)]
    pub variants: bool,
    /// Frame size cases to run, by index (0: 1280x720, 1: 1920x1200, 2: 3840x2160);
    /// default all.
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<usize>,
    /// conv2d sizes to time, e.g. `3,5,7` (the default); `--conv-sizes 0` for none.
    #[arg(long, value_delimiter = ',', default_value = "3,5,7")]
    pub conv_sizes: Vec<u32>,
    /// Only measure start-up: open the backend with kernels cached in this directory
    /// (compiled and stored there when missing) and process one frame. Run it twice
    /// with an empty directory for the cold and the warm start.
    #[arg(long, value_name = "CACHE_DIR")]
    pub startup: Option<PathBuf>,
    /// Frame size of `--startup` (rgb8, default configuration: 640x480 letterbox).
    #[arg(long, value_name = "WxH", default_value = "1280x720", value_parser = parse_size)]
    pub startup_frame: (u32, u32),
    /// With `--startup`: print the breakdown as one JSON line (`startup-json: {...}`),
    /// then keep the process with its backend open (and its GPU memory held) this many
    /// milliseconds, so that `nvidia-smi` and /proc can read its memory.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub hold_ms: u64,
    /// Read each case's frame from `DIR/case<i>.raw` (width x height x 3 bytes) instead
    /// of random bytes, and write the tensor the backend makes of it (with the frame
    /// conv2d) to `DIR/case<i>.tensor` (float32 NCHW), for `bench/bench_gpu_torch.py`.
    #[arg(long, value_name = "DIR")]
    pub frames: Option<PathBuf>,
    /// Gaussian conv2d size (sigma from the size, zero border) in the "GPU frame" and
    /// "full frame" figures; 0: none.
    #[arg(long, default_value_t = 5)]
    pub frame_conv: u32,
}

/// `WxH` -> (W, H).
fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(|| format!("expected WxH, got `{s}`"))?;
    let p = |v: &str| v.trim().parse::<u32>().map_err(|e| format!("`{v}` in `{s}`: {e}"));
    match (p(w)?, p(h)?) {
        (0, _) | (_, 0) => Err(format!("`{s}`: width and height must be at least 1")),
        size => Ok(size),
    }
}

/// Run `vision_preproc bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    if let Some(dir) = &args.startup {
        let (frame, hold) = (args.startup_frame, args.hold_ms);
        let mut report = |r: &serde_json::Value| {
            let num = |k: &str| r.get(k).and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN);
            let flag = |k: &str| r.get(k).and_then(serde_json::Value::as_bool).unwrap_or(false);
            let kernels = if flag("embedded") {
                "embedded kernels"
            } else if flag("cached") {
                "kernels from the cache"
            } else {
                "kernels compiled or JIT-compiled"
            };
            println!(
                "startup: context {:.1} ms, backend open {:.1} ms ({}), first {}x{} frame {:.1} ms, \
                 context to first tensor {:.1} ms, RSS {:.1} MB",
                num("context_ms"),
                num("open_ms"),
                kernels,
                frame.0,
                frame.1,
                num("first_frame_ms"),
                num("context_to_first_tensor_ms"),
                num("rss_kb") / 1e3,
            );
            if hold > 0 {
                // The backend is still open: its memory can be read from outside.
                println!("startup-json: {r}");
                std::thread::sleep(std::time::Duration::from_millis(hold));
            }
        };
        startup::startup(args.device, Some(dir), frame, &mut report)?;
        return Ok(());
    }
    let opts = BenchOptions {
        device_id: args.device,
        iterations: args.iterations,
        warmup: args.warmup,
        variants: args.variants,
        cases: args.cases.clone(),
        conv_sizes: args.conv_sizes.iter().copied().filter(|&k| k > 0).collect(),
        frames_dir: args.frames.clone(),
        frame_conv: args.frame_conv,
    };
    let report = bench(&opts)?;
    let text = serde_json::to_string_pretty(&report.json).context("serializing the results")?;
    std::fs::write(&args.out, text + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    print!("{}", report.table);
    println!("results written to {}", args.out.display());
    Ok(())
}
