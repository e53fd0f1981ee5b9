//! `vision_preproc`: the offline command-line tool (no ROS needed).

// The house rules that a lint can keep (docs/ARCHITECTURE.md): no unwrap/expect outside
// tests, a `// SAFETY:` comment on every unsafe block.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(clippy::undocumented_unsafe_blocks)]

// The benchmarks and the tests' conv2d tool: only in a build with the `bench` feature.
#[cfg(feature = "bench")]
mod bench;
#[cfg(feature = "bench")]
mod bench_batch;
#[cfg(feature = "bench")]
mod bench_cpu;
#[cfg(feature = "bench")]
mod conv_file;
#[cfg(feature = "bench")]
mod decode_file;
#[cfg(feature = "bench")]
mod geometry_cases;
mod input;
mod play;
mod record;
mod replay;
mod replay_video;
mod run_file;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use vision_preproc::pipeline::select_backend;
use vision_preproc::Config;

#[derive(Parser)]
#[command(
    name = "vision_preproc",
    version,
    about = "Offline tools of vision_preproc: configurations, files, bags (benchmarks: built with the cargo feature `bench`)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse and validate a parameters file (ROS `ros__parameters` shape, read as the node
    /// reads it) and print the resolved configuration; parameters vision_preproc does not
    /// have are warned about on stderr.
    CheckConfig {
        /// The YAML file.
        file: PathBuf,
    },
    /// Say which backend `backend: auto` would pick on this machine, and why.
    Info,
    /// Benchmark the CUDA backend (fused vs three-kernel, tiled vs naive conv2d, upload,
    /// download, full frame); prints a table and writes results.json. (Built with the
    /// cargo feature `bench`.)
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
    /// (tests) The CPU conv2d alone on a float32 (C, H, W) .npy.
    #[cfg(feature = "bench")]
    #[command(hide = true)]
    ConvFile(conv_file::ConvFileArgs),
    /// (benchmark) JPEG decode per frame, 1 and N cameras: the CPU decoder against nvJPEG.
    #[cfg(feature = "bench")]
    #[command(hide = true)]
    BenchDecode(bench::decode::BenchDecodeArgs),
    /// (tests) One compressed image payload (JPEG/PNG) decoded to raw pixels.
    #[cfg(feature = "bench")]
    #[command(hide = true)]
    DecodeFile(decode_file::DecodeFileArgs),
    /// (tests) Seeded random geometry cases with the box mapping's results.
    #[cfg(feature = "bench")]
    #[command(hide = true)]
    GeometryCases(geometry_cases::GeometryCasesArgs),
    /// Run one image file (PNG/JPEG, or raw bytes of any encoding) through the pipeline
    /// and write the tensor as .npy (and a preview PNG).
    RunFile(run_file::RunFileArgs),
    /// Time the CPU backend per frame (p50/p99). (Built with the cargo feature `bench`.)
    #[cfg(feature = "bench")]
    BenchCpu(bench_cpu::BenchCpuArgs),
    /// N cameras through one batched pipeline vs N single-camera pipelines (work per
    /// batch, highest rate, latency at the camera rate), on the CPU or CUDA backend.
    /// (Built with the cargo feature `bench`.)
    #[cfg(feature = "bench")]
    BenchBatch(bench_batch::BenchBatchArgs),
    /// Run the pipeline on every image (raw or compressed) of a rosbag2 bag (MCAP or
    /// sqlite3) and write the tensors and timings to a new MCAP bag.
    Replay(replay::ReplayArgs),
    /// Publish a bag's images (raw or compressed) and camera_info as a ROS 2 publisher,
    /// with the recorded timing (needs the `ros` build).
    Play(play::PlayArgs),
    /// Subscribe to the node's tensor and timing topics and write them to an MCAP bag
    /// (needs the `ros` build).
    Record(record::RecordArgs),
}

fn main() -> ExitCode {
    // Errors as one clear message (the chain of causes), exit code 1; never a backtrace.
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::CheckConfig { file } => {
            let cfg = input::with_warnings(Config::load_yaml_file(&file, &[])?);
            print!("{}", serde_yaml::to_string(&cfg).context("printing the configuration")?);
        }
        Command::Info => {
            let cfg = Config::default();
            let (backend, fallback) = select_backend(&cfg)?;
            println!("vision_preproc {}", env!("CARGO_PKG_VERSION"));
            println!("backend (auto): {} — {}", backend.name(), backend.device_description());
            for (key, value) in backend.diagnostics() {
                println!("  {key}: {value}");
            }
            if let Some(reason) = fallback {
                println!("no GPU backend: {reason}");
            }
            println!(
                "compressed frames: cpu backend: on the CPU ({}); cuda backend: {}",
                vision_preproc::backend::HOST_DECODERS,
                vision_preproc::backend::cuda::jpeg_decoder()
            );
            println!("NVTX ranges: {}", vision_preproc::nvtx::status());
            let (fastdds, profile) = vision_preproc::ros::fastdds_status();
            println!("Fast DDS: {fastdds}");
            println!("Fast DDS profile: {profile}");
            println!("GStreamer: {}", vision_preproc::capture::status());
            println!(
                "video inputs (video_decoder auto): {}",
                vision_preproc::capture::decoders_status(cfg.video_decoder)
            );
            println!("GStreamer CUDA memory: {}", vision_preproc::capture::cuda_status());
        }
        Command::RunFile(args) => run_file::run(args)?,
        Command::Replay(args) => replay::run(args)?,
        Command::Play(args) => play::run(args)?,
        Command::Record(args) => record::run(args)?,
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::run(&args)?,
        #[cfg(feature = "bench")]
        Command::BenchCpu(args) => bench_cpu::run(args)?,
        #[cfg(feature = "bench")]
        Command::BenchBatch(args) => bench_batch::run(args)?,
        #[cfg(feature = "bench")]
        Command::BenchDecode(args) => bench::decode::run(args)?,
        #[cfg(feature = "bench")]
        Command::ConvFile(args) => conv_file::run(args)?,
        #[cfg(feature = "bench")]
        Command::DecodeFile(args) => return decode_file::run(args),
        #[cfg(feature = "bench")]
        Command::GeometryCases(args) => geometry_cases::run(args)?,
    }
    Ok(ExitCode::SUCCESS)
}
