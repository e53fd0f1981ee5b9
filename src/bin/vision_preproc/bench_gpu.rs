//! `vision_preproc bench`: run the GPU benchmark (see `backend::cuda::bench`), print its
//! table and write `results.json`; with `--startup`, measure the start-up cost instead.

use anyhow::{Context, Result};
use std::path::PathBuf;
use vision_preproc::backend::cuda::bench::{self, BenchOptions};

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
}

/// Run `vision_preproc bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    if let Some(dir) = &args.startup {
        let (open_ms, frame_ms, cached) = bench::startup(args.device, Some(dir))?;
        println!(
            "startup: backend open {open_ms:.1} ms ({}), first 1280x720 frame {frame_ms:.1} ms, \
             open to first tensor {:.1} ms",
            if cached { "kernels from the cache" } else { "kernels compiled" },
            open_ms + frame_ms
        );
        return Ok(());
    }
    let opts = BenchOptions {
        device_id: args.device,
        iterations: args.iterations,
        warmup: args.warmup,
        variants: args.variants,
        cases: args.cases.clone(),
        conv_sizes: args.conv_sizes.iter().copied().filter(|&k| k > 0).collect(),
    };
    let report = bench::run(&opts)?;
    let text = serde_json::to_string_pretty(&report.json).context("serializing the results")?;
    std::fs::write(&args.out, text + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    print!("{}", report.table);
    println!("results written to {}", args.out.display());
    Ok(())
}
