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
            let cached = r.get("cached").and_then(serde_json::Value::as_bool).unwrap_or(false);
            println!(
                "startup: context {:.1} ms, backend open {:.1} ms ({}), first {}x{} frame {:.1} ms, \
                 context to first tensor {:.1} ms, RSS {:.1} MB",
                num("context_ms"),
                num("open_ms"),
                if cached { "kernels from the cache" } else { "kernels compiled" },
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
        bench::startup(args.device, Some(dir), frame, &mut report)?;
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
    let report = bench::run(&opts)?;
    let text = serde_json::to_string_pretty(&report.json).context("serializing the results")?;
    std::fs::write(&args.out, text + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    print!("{}", report.table);
    println!("results written to {}", args.out.display());
    Ok(())
}
