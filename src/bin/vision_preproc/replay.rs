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
    /// Image topic to process. Default: the bag's only sensor_msgs/msg/Image topic. Give
    /// it two or more times (or a configuration with 2+ `inputs`, as bag topic names) to
    /// batch those cameras into one TensorBatch per batch, with the configuration's
    /// `batch_policy` (stamps from the headers, arrival = the bag's receive time).
    #[arg(long)]
    pub topic: Vec<String>,
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

/// The end of both replay summaries: the reasons counted, the bag's damage, the rate
/// (`count` = (unit, how many) over `wall` seconds) and each stage's p50 / p99.
fn print_summary_tail(
    rejected: &BTreeMap<String, u64>,
    skipped: &BTreeMap<String, u64>,
    damage: &[String],
    (unit, count): (&str, f64),
    wall: f64,
    stages: &mut Stages,
) {
    for (reason, n) in rejected {
        println!("    rejected x{n}: {reason}");
    }
    for (reason, n) in skipped {
        println!("    skipped x{n}: {reason}");
    }
    for d in damage {
        println!("  bag damaged: {d}");
    }
    println!("  {:.1} {unit}/s over {:.2} s", count / wall.max(1e-9), wall);
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
}

fn output_dir(args: &ReplayArgs) -> PathBuf {
    args.output.clone().unwrap_or_else(|| {
        let mut p = args.input.clone().into_os_string();
        p.push("_tensors");
        PathBuf::from(p)
    })
}

/// A recorded image: its CDR.
struct Recorded {
    data: Vec<u8>,
}

/// The configured backend (saying so when `auto` fell back to the CPU) and its name.
fn open_backend(
    cfg: &vision_preproc::Config,
) -> Result<(Box<dyn vision_preproc::backend::Backend>, String)> {
    let (backend, fallback) = select_backend(cfg)?;
    if let Some(reason) = &fallback {
        eprintln!("backend auto: no usable GPU, using the CPU backend ({reason})");
    }
    let name = backend.name().to_string();
    Ok((backend, name))
}

/// `replay` of several image topics: the bag's messages in storage order through the
/// batch former (the node's, with the bag's receive times as arrivals), each batch
/// through `Pipeline::process_batch`, one TensorBatch and one FrameTiming per batch,
/// written at the receive time of the frame that completed it (or the deadline that did).
/// Deterministic: the same bag and configuration give the same batches (and, on the CPU
/// backend, the same bytes).
fn replay_batch(
    args: &ReplayArgs,
    mut cfg: vision_preproc::Config,
    bag: &Bag,
    topics: &[String],
) -> Result<()> {
    use vision_preproc::bag::msgs::Header;
    use vision_preproc::pipeline::batch_sync::{Batch, Batcher, Frame, Item};
    use vision_preproc::pipeline::BatchInput;
    cfg.inputs = topics.to_vec();
    cfg.validate()?;
    let output = output_dir(args);
    let (backend, backend_name) = open_backend(&cfg)?;
    eprintln!(
        "replay: {} [{} cameras: {}] -> {} on {} ({}), batch_policy {}",
        args.input.display(),
        topics.len(),
        topics.join(", "),
        output.display(),
        backend_name,
        backend.device_description(),
        cfg.batch_policy.name()
    );
    let settings = vision_preproc::pipeline::batch_sync::BatchSettings::of(&cfg);
    let mut pipeline = Pipeline::new(cfg, backend)?;
    let mut out = BagWriter::create(&output)?;
    let ns = args.output_namespace.trim_end_matches('/');
    let t_tensor = out.add_topic(&format!("{ns}/tensor"), "vision_preproc_msgs/msg/TensorBatch")?;
    let t_timing = out.add_topic(&format!("{ns}/timing"), "vision_preproc_msgs/msg/FrameTiming")?;
    let mut batcher: Option<Batcher<Recorded>> = None;
    let mut stages = Stages::default();
    let mut rejected: BTreeMap<String, u64> = BTreeMap::new();
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    let (mut frames, mut batches, mut stale_slots) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    let mut process = |batch: Batch<Recorded>,
                       log_time: u64,
                       out: &mut BagWriter|
     -> vision_preproc::Result<()> {
        let t0 = Instant::now();
        let mut decoded = Vec::with_capacity(batch.items.len());
        for (i, item) in batch.items.iter().enumerate() {
            decoded.push(match item {
                Item::Frame { frame, repeated } => match Image::decode(&frame.data.data) {
                    Ok(img) => Some((img, *repeated)),
                    Err(e) => {
                        *skipped
                            .entry(format!("{}: undecodable message: {e}", topics[i]))
                            .or_default() += 1;
                        None
                    }
                },
                Item::Stale => {
                    stale_slots += 1;
                    None
                }
            });
        }
        let mut views = Vec::with_capacity(decoded.len());
        for (i, d) in decoded.iter().enumerate() {
            views.push(match d {
                Some((img, repeated)) => match ImageView::new(
                    img.width,
                    img.height,
                    img.step,
                    &img.encoding,
                    img.is_bigendian != 0,
                    img.data,
                ) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        if !repeated {
                            *rejected.entry(format!("{}: {e}", topics[i])).or_default() += 1;
                        }
                        None
                    }
                },
                None => None,
            });
        }
        let empty = Header::default();
        let inputs: Vec<BatchInput<'_, '_>> = decoded
            .iter()
            .zip(&views)
            .enumerate()
            .map(|(i, (d, v))| BatchInput {
                topic: &topics[i],
                image: v.as_ref(),
                header: d.as_ref().map_or(&empty, |(img, _)| &img.header),
                source_encoding: d.as_ref().map_or("", |(img, _)| img.encoding.as_str()),
                repeated: d.as_ref().is_some_and(|(_, r)| *r),
            })
            .collect();
        let header = inputs
            .iter()
            .filter(|i| i.image.is_some())
            .map(|i| i.header)
            .max_by_key(|h| (h.sec, h.nanosec))
            .map(|h| Header { sec: h.sec, nanosec: h.nanosec, frame_id: String::new() })
            .unwrap_or_default();
        let info = pipeline.process_batch(&inputs, &header)?;
        for (i, reason) in &info.rejected {
            *rejected.entry(format!("{}: {reason}", topics[*i])).or_default() += 1;
        }
        out.write(t_tensor, log_time, pipeline.message())?;
        let total = t0.elapsed().as_secs_f32() * 1e6;
        let t = info.times;
        let timing = frame_timing(&header, batches, &backend_name, &t, total, 0.0, 0);
        out.write(t_timing, log_time, &timing.encode())?;
        stages.upload.push(t.upload_us);
        stages.preprocess.push(t.preprocess_us);
        stages.conv.push(t.conv_us);
        stages.download.push(t.download_us);
        stages.total.push(total);
        batches += 1;
        Ok(())
    };
    let index = |t: &str| topics.iter().position(|x| x == t);
    let mut last_time = 0i64;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let damage = bag.for_each(&names, |m| {
        let Some(cam) = index(&m.topic) else { return Ok(()) };
        frames += 1;
        let now = i64::try_from(m.log_time).unwrap_or(i64::MAX);
        let b = batcher.get_or_insert_with(|| Batcher::new(topics.len(), settings, now));
        // Deadlines (a timeout, a camera going stale) that passed before this message.
        let mut guard = 0;
        while let Some(d) = b.deadline().filter(|&d| d < now) {
            for batch in b.poll(d.saturating_add(1)) {
                process(batch, d.saturating_add(1).max(0) as u64, &mut out)?;
            }
            guard += 1;
            if guard > 4 * topics.len() {
                break;
            }
        }
        let stamp_ns = vision_preproc::bag::msgs::header_stamp_ns(&m.data).unwrap_or(0);
        let frame = Frame {
            stamp_ns,
            received_ns: now,
            data: std::sync::Arc::new(Recorded { data: m.data }),
        };
        for batch in b.push(cam, frame) {
            process(batch, m.log_time, &mut out)?;
        }
        last_time = now;
        Ok(())
    })?;
    // The end of the bag: what a timeout would still have published (latest).
    let mut pending = 0u64;
    if let Some(b) = batcher.as_mut() {
        let end = last_time.saturating_add(settings.batch_timeout).saturating_add(1);
        if settings.policy == vision_preproc::pipeline::batch_sync::BatchPolicy::Latest {
            for batch in b.poll(end) {
                process(batch, end.max(0) as u64, &mut out)?;
            }
        }
        pending = (0..b.len()).map(|i| b.pending(i)).sum();
    }
    let counts: Vec<_> =
        batcher.as_ref().map(|b| (0..b.len()).map(|i| b.counts(i)).collect()).unwrap_or_default();
    let wall = started.elapsed().as_secs_f64();
    let out_dir = out.finish()?;
    println!("replay summary: {} -> {}", args.input.display(), out_dir.display());
    println!("  {} cameras, backend {backend_name}", topics.len());
    println!(
        "  frames {frames}: {batches} batches, {stale_slots} padded (stale) slots, rejected {}, \
         skipped {}, left unbatched at the end {pending}",
        rejected.values().sum::<u64>(),
        skipped.values().sum::<u64>()
    );
    for (i, c) in counts.iter().enumerate() {
        println!(
            "    {}: received {}, batched {}, dropped {}",
            topics[i], c.received, c.batched, c.dropped
        );
    }
    print_summary_tail(
        &rejected,
        &skipped,
        &damage,
        ("batches", batches as f64),
        wall,
        &mut stages,
    );
    Ok(())
}

pub fn run(args: ReplayArgs) -> Result<()> {
    let mut cfg = args.config.load()?;
    if let Some(b) = &args.backend {
        cfg.backend = serde_yaml::from_str::<BackendChoice>(b)
            .with_context(|| format!("--backend {b}: use auto, cuda or cpu"))?;
    }
    let bag = Bag::open(&args.input)?;
    let wanted: Vec<String> = if args.topic.len() >= 2 {
        args.topic.clone()
    } else if args.topic.is_empty() && cfg.is_batch() {
        cfg.inputs.iter().map(|t| format!("/{}", t.trim_start_matches('/'))).collect()
    } else {
        Vec::new()
    };
    if !wanted.is_empty() {
        for t in &wanted {
            bag.image_topic(Some(t))?;
        }
        return replay_batch(&args, cfg, &bag, &wanted);
    }
    let topic = bag.image_topic(args.topic.first().map(String::as_str))?;
    let output = output_dir(&args);

    let (backend, backend_name) = open_backend(&cfg)?;
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
    print_summary_tail(&rejected, &skipped, &damage, ("frames", frames as f64), wall, &mut stages);
    Ok(())
}
