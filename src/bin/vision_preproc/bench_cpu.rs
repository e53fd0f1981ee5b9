//! `vision_preproc bench-cpu`: time the CPU backend per frame (whole `Pipeline::process`:
//! decode, resize, pad, normalize, layout, conv when set) and print p50/p99.
//!
//! Without an image it runs the two scenarios of the speed target on synthetic frames
//! (the work does not depend on pixel values): 1920x1080 bgr8 -> 640x640 letterbox NCHW
//! float32, and 1280x720 yuv422_yuy2 -> 640x480 stretch. `bench/bench_cpu.py` runs this
//! on real photographs next to the OpenCV + NumPy equivalent.

use crate::input::{load_image, ConfigArgs, CpuSimd, OwnedImage, RawArgs};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;
use vision_preproc::percentile::Summary;
use vision_preproc::Pipeline;

/// Arguments of `bench-cpu`.
#[derive(Args, Debug)]
pub struct BenchCpuArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub raw: RawArgs,
    /// Image to process (PNG/JPEG, or raw with --raw); without it, the two built-in
    /// scenarios on synthetic frames.
    pub image: Option<PathBuf>,
    /// Timed frames per scenario.
    #[arg(long, default_value_t = 300)]
    pub frames: usize,
    /// Untimed frames first.
    #[arg(long, default_value_t = 30)]
    pub warmup: usize,
    /// Worker threads (default: rayon's default, one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// One JSON object per scenario (with every sample) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The inner loops: `auto` (AVX2 on x86-64, NEON on aarch64, when the CPU has them)
    /// or `baseline` (the portable loops; the same values).
    #[arg(long, value_enum, default_value_t = CpuSimd::Auto)]
    pub cpu_simd: CpuSimd,
    /// The same as `--cpu-simd baseline`.
    #[arg(long)]
    pub no_avx2: bool,
}

struct Scenario {
    name: String,
    image: OwnedImage,
    overrides: Vec<String>,
}

/// Run `bench-cpu`.
pub fn run(args: BenchCpuArgs) -> Result<()> {
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("setting the number of threads")?;
    }
    let scenarios = match &args.image {
        Some(path) => vec![Scenario {
            name: path.display().to_string(),
            image: load_image(path, &args.raw)?,
            overrides: Vec::new(),
        }],
        None => builtin(),
    };
    if !args.json {
        println!(
            "{:<58} {:>8} {:>8} {:>8} {:>8}  ({} threads, {} frames)",
            "scenario",
            "p50 ms",
            "p99 ms",
            "mean ms",
            "min ms",
            rayon::current_num_threads(),
            args.frames
        );
    }
    for sc in scenarios {
        run_scenario(&args, sc)?;
    }
    Ok(())
}

/// One scenario: its configuration (the scenario's overrides, then `--set`), the warm-up,
/// the timed frames, and its line (or JSON object).
fn run_scenario(args: &BenchCpuArgs, sc: Scenario) -> Result<()> {
    let mut cfg_args = args.config.clone();
    let mut sets = sc.overrides.clone();
    let name = if cfg_args.set.is_empty() {
        sc.name.clone()
    } else {
        format!("{} [{}]", sc.name, cfg_args.set.join(", "))
    };
    sets.append(&mut cfg_args.set);
    cfg_args.set = sets;
    let cfg = cfg_args.load()?;
    let view = sc.image.view()?;
    let cpu = if args.no_avx2 { CpuSimd::Baseline.backend() } else { args.cpu_simd.backend() };
    let simd = cpu.simd();
    let mut pipeline = Pipeline::new(cfg, Box::new(cpu))?;
    for _ in 0..args.warmup {
        pipeline.process(&view)?;
    }
    let mut ms = Vec::with_capacity(args.frames);
    for _ in 0..args.frames.max(1) {
        let t = Instant::now();
        pipeline.process(&view)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let s = Summary::of(&ms).context("no timed iterations")?;
    if args.json {
        let samples: Vec<String> = ms.iter().map(|v| format!("{v:.4}")).collect();
        println!(
            "{{\"scenario\": {:?}, \"simd\": \"{:?}\", \"threads\": {}, \"frames\": {}, \"p50_ms\": {:.4}, \"p99_ms\": {:.4}, \"mean_ms\": {:.4}, \"min_ms\": {:.4}, \"samples_ms\": [{}]}}",
            name,
            simd,
            rayon::current_num_threads(),
            ms.len(),
            s.p50,
            s.p99,
            s.mean,
            s.min,
            samples.join(", ")
        );
    } else {
        println!(
            "{:<58} {:>8.3} {:>8.3} {:>8.3} {:>8.3}  {simd:?}",
            name, s.p50, s.p99, s.mean, s.min
        );
    }
    Ok(())
}

/// A deterministic frame of `len` bytes: smooth gradients plus noise (the work per frame
/// does not depend on the values; this only keeps them plausible).
fn synthetic(width: u32, height: u32, bpp: u32) -> Vec<u8> {
    let (w, h) = (width as usize * bpp as usize, height as usize);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut data = vec![0u8; w * h];
    for (y, row) in data.chunks_exact_mut(w).enumerate() {
        for (x, v) in row.iter_mut().enumerate() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *v = ((x / 8 + y / 4) as u64 + (state & 31)) as u8;
        }
    }
    data
}

fn builtin() -> Vec<Scenario> {
    let frame = |w: u32, h: u32, enc: &str, bpp: u32| OwnedImage {
        width: w,
        height: h,
        step: w * bpp,
        encoding: enc.to_string(),
        big_endian: false,
        data: synthetic(w, h, bpp),
    };
    let sets = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        Scenario {
            name: "1920x1080 bgr8 -> 640x640 letterbox NCHW float32".into(),
            image: frame(1920, 1080, "bgr8", 3),
            overrides: sets(&[
                "network_image_width=640",
                "network_image_height=640",
                "resize_mode=letterbox",
                "output_layout=NCHW",
                "output_dtype=float32",
            ]),
        },
        Scenario {
            name: "1280x720 yuv422_yuy2 -> 640x480 stretch NCHW float32".into(),
            image: frame(1280, 720, "yuv422_yuy2", 2),
            overrides: sets(&[
                "network_image_width=640",
                "network_image_height=480",
                "resize_mode=stretch",
                "output_layout=NCHW",
                "output_dtype=float32",
            ]),
        },
    ]
}
