//! `vision_preproc record OUT`: subscribe to the node's `tensor` and `timing` topics and
//! write what arrives to an MCAP bag (like `ros2 bag record`, which PyPI does not have).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use vision_preproc::percentile::nearest_rank;
use vision_preproc::ros::{record, RecordOptions, RecordStats};

/// Arguments of `record`.
#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Output bag folder (must not exist).
    #[arg(required_unless_present = "count_only", conflicts_with = "count_only")]
    pub output: Option<PathBuf>,
    /// Write nothing: only receive, count and time the tensors and timings (the latency
    /// line below), e.g. as the subscriber of a rate sweep, where writing the tensors
    /// would be the bottleneck.
    #[arg(long)]
    pub count_only: bool,
    /// Tensor topic to record.
    #[arg(long, default_value = "tensor")]
    pub tensor_topic: String,
    /// The node has 2+ `inputs`: the tensor topic carries `TensorBatch` (end-to-end
    /// latency then per valid, not repeated item).
    #[arg(long)]
    pub batch: bool,
    /// FrameTiming topic to record.
    #[arg(long, default_value = "timing")]
    pub timing_topic: String,
    /// Stop after this many tensors.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds (else at Ctrl-C or SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Also print each /diagnostics status whose level or message changed.
    #[arg(long)]
    pub diagnostics: bool,
    /// Write the latency summary (and every sample) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// FrameTiming's stages in `RecordStats::stages_us`, in order.
const STAGES: [&str; 5] = ["decode", "upload", "preprocess", "conv", "download"];

/// Nearest-rank percentile of sorted samples (NaN without samples).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    nearest_rank(sorted, p).unwrap_or(f64::NAN)
}

/// `--duration` in seconds, checked.
fn duration(seconds: Option<f64>) -> Result<Option<std::time::Duration>> {
    Ok(match seconds {
        Some(s) if s.is_finite() && s > 0.0 => Some(std::time::Duration::from_secs_f64(s)),
        Some(s) => bail!("--duration {s}: use a positive number of seconds"),
        None => None,
    })
}

pub fn run(a: RecordArgs) -> Result<()> {
    let stats = record(&RecordOptions {
        output: a.output.clone(),
        tensor_topic: a.tensor_topic.clone(),
        batch: a.batch,
        timing_topic: a.timing_topic.clone(),
        count: a.count,
        duration: duration(a.duration)?,
        print_diagnostics: a.diagnostics,
    })?;
    match &stats.output {
        Some(path) => println!(
            "record: {} tensors, {} timings written to {}",
            stats.tensors,
            stats.timings,
            path.display()
        ),
        None => println!(
            "record: {} tensors, {} timings received (--count-only: nothing written)",
            stats.tensors, stats.timings
        ),
    }
    let mut e2e = stats.e2e_ms.clone();
    let mut node = stats.node_ms.clone();
    e2e.sort_by(f64::total_cmp);
    node.sort_by(f64::total_cmp);
    let fps = match stats.first_last_ns {
        Some((a, b)) if b > a && stats.tensors > 1 => {
            (stats.tensors - 1) as f64 / ((b - a) as f64 / 1e9)
        }
        _ => 0.0,
    };
    println!(
        "latency: stamp -> received p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (end-to-end when \
         the publisher restamps); node-added p50 {:.2} ms, p99 {:.2} ms; {fps:.1} tensors/s",
        percentile(&e2e, 50.0),
        percentile(&e2e, 99.0),
        e2e.last().copied().unwrap_or(f64::NAN),
        percentile(&node, 50.0),
        percentile(&node, 99.0),
    );
    let stage = |i: usize, p: f64| stage_ms(&stats, i, p);
    println!(
        "stages p50 (p99), ms: {}",
        STAGES
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name} {:.3} ({:.3})", stage(i, 50.0), stage(i, 99.0)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(path) = &a.json {
        write_json(path, &stats, (&e2e, &node), fps)?;
    }
    Ok(())
}

/// FrameTiming's stage `i`, percentile `p` in ms: what of node-added the backend reports.
fn stage_ms(stats: &RecordStats, i: usize, p: f64) -> f64 {
    let mut v: Vec<f64> = stats.stages_us.iter().map(|s| f64::from(s[i]) / 1e3).collect();
    v.sort_by(f64::total_cmp);
    percentile(&v, p)
}

/// The `--json` summary: counts, rate, latency percentiles (`e2e`, `node`: sorted), the
/// stages, and every latency.
fn write_json(
    path: &std::path::Path,
    stats: &RecordStats,
    (e2e, node): (&[f64], &[f64]),
    fps: f64,
) -> Result<()> {
    let stages = |p: f64| -> serde_json::Map<String, serde_json::Value> {
        STAGES
            .iter()
            .enumerate()
            .map(|(i, name)| (name.to_string(), serde_json::json!(stage_ms(stats, i, p))))
            .collect()
    };
    let doc = serde_json::json!({
        "tensors": stats.tensors,
        "timings": stats.timings,
        "fps": fps,
        "first_tensor_ns": stats.first_last_ns.map(|(a, _)| a),
        "e2e_ms_p50": percentile(e2e, 50.0),
        "e2e_ms_p99": percentile(e2e, 99.0),
        "added_ms_p50": percentile(node, 50.0),
        "added_ms_p99": percentile(node, 99.0),
        // FrameTiming stages in ms (decode: compressed frames; 0 for raw ones).
        "stages_ms_p50": stages(50.0),
        "stages_ms_p99": stages(99.0),
        "e2e_ms": stats.e2e_ms,
        "added_ms": stats.node_ms,
    });
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
