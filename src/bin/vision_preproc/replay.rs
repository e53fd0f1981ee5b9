//! `vision_preproc replay IN [-o OUT]`: run the pipeline on every image of a bag and write
//! the tensors and timings to a new rosbag2 MCAP bag.

use crate::input::ConfigArgs;
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use vision_preproc::bag::msgs::Image;
use vision_preproc::bag::{Bag, BagWriter};
use vision_preproc::config::BackendChoice;
use vision_preproc::percentile::nearest_rank;
use vision_preproc::pipeline::{frame_timing, select_backend};
use vision_preproc::{Error, ImageView, Pipeline};

/// Arguments of `replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Input bag: a rosbag2 folder (metadata.yaml + .mcap or .db3), a .mcap or a .db3 file.
    pub input: PathBuf,
    /// Output bag folder (must not exist). Default: `<input>_tensors`.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Image topic to process. Default: the bag's only sensor_msgs/msg/Image topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Backend: auto | cuda | cpu (overrides the configuration's `backend`).
    #[arg(long)]
    pub backend: Option<String>,
    /// Namespace of the output topics: `<ns>/tensor` and `<ns>/timing`.
    #[arg(long, default_value = "/vision_preproc")]
    pub output_namespace: String,
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// Per-stage samples, microseconds.
#[derive(Default)]
struct Stages {
    upload: Vec<f32>,
    preprocess: Vec<f32>,
    conv: Vec<f32>,
    download: Vec<f32>,
    total: Vec<f32>,
}

fn pct(v: &mut [f32], q: f64) -> f32 {
    v.sort_by(f32::total_cmp);
    nearest_rank(v, q).unwrap_or(f32::NAN)
}

pub fn run(args: ReplayArgs) -> Result<()> {
    let mut cfg = args.config.load()?;
    if let Some(b) = &args.backend {
        cfg.backend = serde_yaml::from_str::<BackendChoice>(b)
            .with_context(|| format!("--backend {b}: use auto, cuda or cpu"))?;
    }
    let bag = Bag::open(&args.input)?;
    let topic = bag.image_topic(args.topic.as_deref())?;
    let output = args.output.clone().unwrap_or_else(|| {
        let mut p = args.input.clone().into_os_string();
        p.push("_tensors");
        PathBuf::from(p)
    });

    let (backend, fallback) = select_backend(&cfg)?;
    if let Some(reason) = &fallback {
        eprintln!("backend auto: no usable GPU, using the CPU backend ({reason})");
    }
    let backend_name = backend.name().to_string();
    eprintln!(
        "replay: {} [{topic}] -> {} on {} ({})",
        args.input.display(),
        output.display(),
        backend_name,
        backend.device_description()
    );
    let mut pipeline = Pipeline::new(cfg, backend)?;

    let mut out = BagWriter::create(&output)?;
    let ns = args.output_namespace.trim_end_matches('/');
    let t_tensor = out.add_topic(&format!("{ns}/tensor"), "vision_preproc_msgs/msg/Tensor")?;
    let t_timing = out.add_topic(&format!("{ns}/timing"), "vision_preproc_msgs/msg/FrameTiming")?;

    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {pos} frames {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let mut stages = Stages::default();
    let mut rejected: BTreeMap<String, u64> = BTreeMap::new();
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    let (mut frames, mut published) = (0u64, 0u64);
    let started = Instant::now();
    let damage = bag.for_each(&[topic.as_str()], |m| {
        frames += 1;
        bar.inc(1);
        let t0 = Instant::now();
        let img = match Image::decode(&m.data) {
            Ok(img) => img,
            Err(e) => {
                *skipped.entry(format!("undecodable message: {e}")).or_default() += 1;
                return Ok(());
            }
        };
        let view = ImageView::new(
            img.width,
            img.height,
            img.step,
            &img.encoding,
            img.is_bigendian != 0,
            img.data,
        );
        let info = match view
            .map_err(Error::from)
            .and_then(|v| pipeline.process_message(&v, &img.header, &img.encoding))
        {
            Ok(info) => info,
            Err(Error::Image(e)) => {
                *rejected.entry(e.to_string()).or_default() += 1;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        out.write(t_tensor, m.log_time, pipeline.message())?;
        let total = t0.elapsed().as_secs_f32() * 1e6;
        let t = info.times;
        // age_us: not meaningful offline (the stamps are from the recording), 0.
        let timing = frame_timing(&img.header, published, &backend_name, &t, total, 0.0, 0);
        out.write(t_timing, m.log_time, &timing.encode())?;
        stages.upload.push(t.upload_us);
        stages.preprocess.push(t.preprocess_us);
        stages.conv.push(t.conv_us);
        stages.download.push(t.download_us);
        stages.total.push(total);
        published += 1;
        Ok(())
    })?;
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    let out_dir = out.finish()?;

    println!("replay summary: {} -> {}", args.input.display(), out_dir.display());
    println!("  topic {topic}, backend {backend_name}");
    println!(
        "  frames {frames}: published {published}, rejected {}, skipped {}",
        rejected.values().sum::<u64>(),
        skipped.values().sum::<u64>()
    );
    for (reason, n) in &rejected {
        println!("    rejected x{n}: {reason}");
    }
    for (reason, n) in &skipped {
        println!("    skipped x{n}: {reason}");
    }
    for d in &damage {
        println!("  bag damaged: {d}");
    }
    println!("  {:.1} frames/s over {:.2} s", frames as f64 / wall.max(1e-9), wall);
    println!("  {:<12} {:>10} {:>10}", "stage (us)", "p50", "p99");
    for (name, v) in [
        ("upload", &mut stages.upload),
        ("preprocess", &mut stages.preprocess),
        ("conv", &mut stages.conv),
        ("download", &mut stages.download),
        ("total", &mut stages.total),
    ] {
        println!("  {:<12} {:>10.1} {:>10.1}", name, pct(v, 50.0), pct(v, 99.0));
    }
    Ok(())
}
