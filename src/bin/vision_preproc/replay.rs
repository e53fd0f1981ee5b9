//! `vision_preproc replay IN [-o OUT]`: run the pipeline on every image of a bag (raw
//! `sensor_msgs/Image` or `sensor_msgs/CompressedImage`, or the frames of a video topic
//! decoded by the node's decode path: `replay_video.rs`) and write the tensors and timings
//! to a new rosbag2 MCAP bag.

use crate::input::ConfigArgs;
use crate::replay_video::{self, Decoded, Read, VideoTopic};
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use vision_preproc::bag::{Bag, BagWriter, RawMessage};
use vision_preproc::compressed::{Compressed, DecodeError, Limits};
use vision_preproc::config::{BackendChoice, Transport, VideoDecoder};
use vision_preproc::percentile::nearest_rank;
use vision_preproc::pipeline::{
    frame_timing, open_backend, set_header, slot_reason, Finished, FrameInput, FrameSet, FrameView,
    InFlight, Outputs,
};
use vision_preproc::transport::batch_sync::{
    Batch, BatchPolicy, BatchSettings, Batcher, Frame, Item,
};
use vision_preproc::wire::msgs::{tensor_type, CompressedImage, Header, Image, FRAME_TIMING_TYPE};
use vision_preproc::{Error, ImageView, Pipeline};

/// Arguments of `replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Input bag: a rosbag2 folder (metadata.yaml + .mcap or .db3), a .mcap or a .db3 file.
    pub input: PathBuf,
    /// Output bag folder (must not exist). Default: `<input>_tensors`.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Image topic to process: sensor_msgs/msg/Image, sensor_msgs/msg/CompressedImage
    /// (JPEG, PNG: decoded by the backend; H.264, H.265: by the video decoder), or a video
    /// topic (foxglove_msgs/msg/CompressedVideo, ffmpeg_image_transport_msgs/msg/FFMPEGPacket:
    /// decoded from the first key frame, as in the node; `video_decoder` chooses the decoder). Default: the configuration's input with its
    /// transport (`/<input>`, or `/<input>/compressed`) when the bag has that topic, else
    /// the bag's only image topic of either type. Give it two or more times (or a configuration with 2+ `inputs`, as bag topic
    /// names; an input whose transport is `compressed` is `<input>/compressed`) to batch
    /// those cameras into one TensorBatch per batch, with the configuration's
    /// `batch_policy` (stamps from the headers, arrival = the bag's receive time).
    #[arg(long)]
    pub topic: Vec<String>,
    /// Backend: auto | cuda | cpu (overrides the configuration's `backend`).
    #[arg(long)]
    pub backend: Option<String>,
    /// Namespace of the output topics: `<ns>/tensor` and `<ns>/timing`.
    #[arg(long, default_value = "/vision_preproc")]
    pub output_namespace: String,
    /// Also write the summary as JSON to this file: counts, reasons, undecodable frames
    /// by cause, damage, rate and each stage's p50 / p99 (us).
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// Per-stage samples, microseconds.
#[derive(Default)]
struct Stages {
    decode: Vec<f32>,
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

impl Stages {
    /// Each stage's name and samples, in the order of the summary.
    fn named(&mut self) -> [(&'static str, &mut Vec<f32>); 6] {
        [
            ("decode", &mut self.decode),
            ("upload", &mut self.upload),
            ("preprocess", &mut self.preprocess),
            ("conv", &mut self.conv),
            ("download", &mut self.download),
            ("total", &mut self.total),
        ]
    }
}

/// The end of both replay summaries: the reasons counted (an undecodable compressed
/// frame's cause with its first message), the bag's damage, the rate (`count` = (unit,
/// how many) over `wall` seconds) and each stage's p50 / p99.
fn print_summary_tail(tally: &mut Tally, damage: &[String], (unit, count): (&str, f64), wall: f64) {
    for (reason, n) in &tally.rejected {
        match tally.first_message.get(reason) {
            Some(first) => println!("    rejected x{n}: {reason}; the first: {first}"),
            None => println!("    rejected x{n}: {reason}"),
        }
    }
    for (reason, n) in &tally.skipped {
        println!("    skipped x{n}: {reason}");
    }
    for d in damage {
        println!("  bag damaged: {d}");
    }
    println!("  {:.1} {unit}/s over {:.2} s", count / wall.max(1e-9), wall);
    println!("  {:<12} {:>10} {:>10}", "stage (us)", "p50", "p99");
    for (name, v) in tally.stages.named() {
        println!("  {:<12} {:>10.1} {:>10.1}", name, pct(v, 50.0), pct(v, 99.0));
    }
}

/// `--json`: the summary as one document.
fn write_json(
    path: &std::path::Path,
    tally: &mut Tally,
    (output, backend, topics): (&std::path::Path, &str, &[String]),
    (damage, videos): (&[String], &[(&str, &VideoTopic)]),
    wall: f64,
) -> Result<()> {
    let stages: serde_json::Map<String, serde_json::Value> = tally
        .stages
        .named()
        .into_iter()
        .map(|(name, v)| {
            let (p50, p99) = (pct(v, 50.0), pct(v, 99.0));
            (name.to_string(), serde_json::json!({ "p50": p50, "p99": p99 }))
        })
        .collect();
    let unit = if topics.len() >= 2 { tally.sets } else { tally.frames };
    let doc = serde_json::json!({
        "output": output.display().to_string(),
        "backend": backend,
        "topics": topics,
        "frames": tally.frames,
        "published": tally.sets,
        "rejected": tally.rejected,
        "skipped": tally.skipped,
        "undecodable": tally.undecodable,
        "damage": damage,
        "wall_s": wall,
        "per_s": unit as f64 / wall.max(1e-9),
        "stages_us": stages,
        "video": videos
            .iter()
            .map(|(t, v)| (t.to_string(), replay_video::summary_json(v)))
            .collect::<serde_json::Map<_, _>>(),
    });
    let text = serde_json::to_string_pretty(&doc).context("writing the summary as JSON")?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn output_dir(args: &ReplayArgs) -> PathBuf {
    args.output.clone().unwrap_or_else(|| {
        let mut p = args.input.clone().into_os_string();
        p.push("_tensors");
        PathBuf::from(p)
    })
}

/// A recorded image: its message's CDR, or a frame decoded from a video topic's packets.
enum Recorded {
    Message(Vec<u8>),
    Decoded { frame: Box<vision_preproc::capture::Frame>, header: Header },
}

/// An input of the replay: a bag topic and what its messages are.
struct Input {
    name: String,
    /// `sensor_msgs/CompressedImage` (else `sensor_msgs/Image` or a video topic).
    compressed: bool,
    /// The transport its type is: `raw`, `compressed`, `foxglove`, `ffmpeg`.
    transport: Transport,
}

impl Input {
    /// Its messages are (or may be, for a compressed topic) video packets.
    fn may_be_video(&self) -> bool {
        self.transport != Transport::Raw
    }
}

/// Counts of one replay, for its summary.
#[derive(Default)]
struct Tally {
    frames: u64,
    sets: u64,
    stale_slots: u64,
    rejected: BTreeMap<String, u64>,
    skipped: BTreeMap<String, u64>,
    /// Compressed frames that did not decode, by cause (`DecodeError::kind`; also in
    /// `rejected`).
    undecodable: BTreeMap<&'static str, u64>,
    /// The first full message of a reason counted by cause (an undecodable frame's).
    first_message: BTreeMap<String, String>,
    stages: Stages,
}

impl Tally {
    /// `reason` of input `slot` (named with 2+ inputs) into `map`.
    fn count(map: &mut BTreeMap<String, u64>, topics: &[String], slot: usize, reason: String) {
        *map.entry(slot_reason(topics, slot, &reason)).or_default() += 1;
    }

    /// A compressed frame of input `slot` that did not decode: rejected, counted by its
    /// cause (`truncated`, `corrupt`, ...), whose first message the summary shows.
    fn undecodable(&mut self, topics: &[String], slot: usize, e: &DecodeError) {
        let reason =
            slot_reason(topics, slot, &format!("undecodable compressed image ({})", e.kind()));
        *self.undecodable.entry(e.kind()).or_default() += 1;
        self.first_message.entry(reason.clone()).or_insert_with(|| e.to_string());
        *self.rejected.entry(reason).or_default() += 1;
    }
}

/// `replay`: the bag's messages of `inputs` in storage order through the frame-set
/// former (the node's, with the bag's receive times as arrivals; one topic is a batch of
/// one, each frame a set), each set through `Pipeline::process_frames` (a compressed
/// topic's frames as compressed frames, decoded by the backend, as in the node), one
/// message (`Tensor` for one topic, `TensorBatch` for 2+) and one FrameTiming per set,
/// written at the receive time of the frame that completed it (or the deadline that did).
/// Deterministic: the same bag and configuration give the same sets (and, on the CPU
/// backend, the same bytes).
fn replay(
    args: &ReplayArgs,
    cfg: vision_preproc::Config,
    bag: &Bag,
    inputs: &[Input],
) -> Result<()> {
    let topics: Vec<String> = inputs.iter().map(|i| i.name.clone()).collect();
    let topics = topics.as_slice();
    let compressed: Vec<bool> = inputs.iter().map(|i| i.compressed).collect();
    let cfg = bag_config(cfg, topics)?;
    let batch = cfg.is_batch();
    let policy = cfg.video_decoder;
    let output = output_dir(args);
    let (backend, _) = open_backend(&cfg, |w| eprintln!("{w}"))?;
    let backend_name = backend.name().to_string();
    eprintln!(
        "replay: {} [{}] -> {} on {} ({}){}",
        args.input.display(),
        topics.join(", "),
        output.display(),
        backend_name,
        backend.device_description(),
        if batch { format!(", batch_policy {}", cfg.batch_policy.name()) } else { String::new() }
    );
    let settings = BatchSettings::of(&cfg); // one topic: each frame a set of one
    let pipeline = Pipeline::new(cfg, backend)?;
    let mut out = BagWriter::create(&output)?;
    let ns = args.output_namespace.trim_end_matches('/');
    let t_tensor = out.add_topic(&format!("{ns}/tensor"), tensor_type(batch))?;
    let t_timing = out.add_topic(&format!("{ns}/timing"), FRAME_TIMING_TYPE)?;
    let bar = progress_bar();
    let mut batcher: Option<Batcher<Recorded>> = None;
    let mut tally = Tally::default();
    let started = Instant::now();
    // On CUDA set k+1 is submitted before set k is finished and written, as in the node.
    let mut sets = InFlight::new(pipeline);
    let topic_ids = (t_tensor, t_timing);
    // `Some(set)`: push it and write what comes out; `None` (the end): finish every set.
    let mut process =
        |set: Option<(Batch<Recorded>, u64)>, out: &mut BagWriter| -> vision_preproc::Result<()> {
            let done = match set {
                Some((batch, log_time)) => {
                    let set = RecordedSet::new(batch, log_time, (topics, &compressed), &mut tally);
                    if topics.len() < 2 && set.frames[0].is_none() {
                        return Ok(()); // a single camera's frame refused: nothing to write
                    }
                    sets.push(set, Outputs::message())
                }
                None => sets.drain(),
            };
            for finished in done {
                write_set(finished, out, topic_ids, &mut tally, &backend_name)?;
            }
            Ok(())
        };
    let index = |t: &str| topics.iter().position(|x| x == t);
    let mut last_time = 0i64;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let mut videos: Vec<Option<VideoTopic>> = inputs.iter().map(|_| None).collect();
    let damage = bag.for_each(&names, |m| {
        let Some(cam) = index(&m.topic) else { return Ok(()) };
        bar.inc(1);
        let now = i64::try_from(m.log_time).unwrap_or(i64::MAX);
        let b = batcher.get_or_insert_with(|| Batcher::new(topics.len(), settings, now));
        for set in deadline_sets(b, now, topics.len()) {
            process(Some(set), &mut out)?;
        }
        for (frame, log_time) in arrivals(m, (&inputs[cam], &mut videos[cam]), policy) {
            for set in b.push(cam, frame) {
                process(Some((set, log_time)), &mut out)?;
            }
        }
        last_time = now;
        Ok(())
    })?;
    bar.finish_and_clear();
    let pending =
        end_of_bag((batcher.as_mut(), &mut videos), (settings, last_time), &mut out, &mut process)?;
    let counts: Vec<_> =
        batcher.as_ref().map(|b| (0..b.len()).map(|i| b.counts(i)).collect()).unwrap_or_default();
    tally.frames = counts.iter().map(|c| c.received).sum();
    let wall = started.elapsed().as_secs_f64();
    let out_dir = out.finish()?;
    let ran = (out_dir.as_path(), backend_name.as_str(), inputs);
    summarize(args, &mut tally, ran, (&counts, pending), (&damage, &videos), wall)
}

/// The summary of a replay (of `inputs` into `output` on `backend`): printed, and written
/// as JSON with `--json`.
fn summarize(
    args: &ReplayArgs,
    tally: &mut Tally,
    (output, backend, inputs): (&std::path::Path, &str, &[Input]),
    (counts, pending): (&[vision_preproc::transport::batch_sync::CameraCounts], u64),
    (damage, videos): (&[String], &[Option<VideoTopic>]),
    wall: f64,
) -> Result<()> {
    println!("replay summary: {} -> {}", args.input.display(), output.display());
    print_counts(tally, inputs, backend, counts, pending);
    let videos: Vec<(&str, &VideoTopic)> = inputs
        .iter()
        .zip(videos)
        .filter_map(|(i, v)| Some((i.name.as_str(), v.as_ref()?)))
        .collect();
    for (topic, v) in &videos {
        for line in replay_video::summary_lines(topic, v) {
            println!("  {line}");
        }
    }
    let batch = inputs.len() >= 2;
    let unit = if batch { ("batches", tally.sets as f64) } else { ("frames", tally.frames as f64) };
    print_summary_tail(tally, damage, unit, wall);
    if let Some(path) = &args.json {
        let topics: Vec<String> = inputs.iter().map(|i| i.name.clone()).collect();
        write_json(path, tally, (output, backend, &topics), (damage, &videos), wall)?;
    }
    Ok(())
}

/// The frames message `m` of an input brings: itself, received at its receive time; or
/// for a video packet (into the input's decode path, started by its first) the frames
/// its decoder gave since the last one, each received at its own packet's time.
fn arrivals(
    m: RawMessage,
    (input, video): (&Input, &mut Option<VideoTopic>),
    policy: VideoDecoder,
) -> Vec<(Frame<Recorded>, u64)> {
    if input.may_be_video() {
        match replay_video::read(&m.data, input.transport) {
            Ok(Read::Packet(p)) => {
                let v = video.get_or_insert_with(|| VideoTopic::new(policy));
                return v.push(&p, m.log_time).into_iter().map(decoded_frame).collect();
            }
            // A compressed image (JPEG, PNG), or a message that is not one: the compressed
            // path reads it (and counts why not).
            Ok(Read::NotVideo) => {}
            Err(_) if input.compressed => {}
            Err(e) => {
                video.get_or_insert_with(|| VideoTopic::new(policy)).not_cdr(e);
                return Vec::new();
            }
        }
    }
    let stamp_ns = vision_preproc::wire::msgs::header_stamp_ns(&m.data).unwrap_or(0);
    let now = i64::try_from(m.log_time).unwrap_or(i64::MAX);
    let data = Arc::new(Recorded::Message(m.data));
    vec![(Frame { stamp_ns, received_ns: now, data }, m.log_time)]
}

/// A frame out of a video topic's decoder, into the frame-set former.
fn decoded_frame(d: Decoded) -> (Frame<Recorded>, u64) {
    let stamp_ns = d.header.stamp_ns();
    let received_ns = i64::try_from(d.received).unwrap_or(i64::MAX);
    let data = Arc::new(Recorded::Decoded { frame: Box::new(d.frame), header: d.header });
    (Frame { stamp_ns, received_ns, data }, d.received)
}

/// The sets formed by the deadlines (a timeout, a camera going stale) that passed before
/// `now`, each with the time it was formed at.
fn deadline_sets(
    b: &mut Batcher<Recorded>,
    now: i64,
    cameras: usize,
) -> Vec<(Batch<Recorded>, u64)> {
    let mut out = Vec::new();
    let mut guard = 0;
    while let Some(d) = b.deadline().filter(|&d| d < now) {
        let at = d.saturating_add(1);
        out.extend(b.poll(at).into_iter().map(|set| (set, at.max(0) as u64)));
        guard += 1;
        if guard > 4 * cameras {
            break;
        }
    }
    out
}

/// The end of the bag: the frames each video topic's decoder still held, the sets a
/// timeout would still have published (`latest`), then every set in flight finished;
/// returns the frames still pending.
fn end_of_bag(
    (batcher, videos): (Option<&mut Batcher<Recorded>>, &mut [Option<VideoTopic>]),
    (settings, mut last_time): (BatchSettings, i64),
    out: &mut BagWriter,
    process: &mut impl FnMut(
        Option<(Batch<Recorded>, u64)>,
        &mut BagWriter,
    ) -> vision_preproc::Result<()>,
) -> vision_preproc::Result<u64> {
    let mut pending = 0u64;
    if let Some(b) = batcher {
        for (cam, v) in videos.iter_mut().enumerate() {
            let last = v.as_mut().map(VideoTopic::finish).unwrap_or_default();
            for (frame, log_time) in last.into_iter().map(decoded_frame) {
                last_time = last_time.max(frame.received_ns);
                for set in b.push(cam, frame) {
                    process(Some((set, log_time)), out)?;
                }
            }
        }
        let end = last_time.saturating_add(settings.batch_timeout).saturating_add(1);
        if settings.policy == BatchPolicy::Latest {
            for set in b.poll(end) {
                process(Some((set, end.max(0) as u64)), out)?;
            }
        }
        pending = (0..b.len()).map(|i| b.pending(i)).sum();
    }
    process(None, out)?;
    Ok(pending)
}

/// `cfg` for a replay of `topics`: the bag's topics are the inputs.
fn bag_config(
    mut cfg: vision_preproc::Config,
    topics: &[String],
) -> vision_preproc::Result<vision_preproc::Config> {
    if topics.len() >= 2 {
        cfg.inputs = topics.to_vec();
    } else {
        cfg.inputs.clear();
    }
    // The bag's topics are the inputs now: no `gst:` pipeline runs offline, the lists
    // that apply to pipelines alone would no longer match `inputs`, and each topic's
    // type says whether its frames are compressed (not the transport parameters).
    cfg.input_frame_ids.clear();
    cfg.camera_info_urls.clear();
    cfg.input_transports.clear();
    cfg.image_transport = Transport::Raw;
    cfg.validate()?;
    Ok(cfg)
}

/// The spinner of a replay: frames read, their rate.
fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {pos} frames {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar
}

/// The summary's counts: per frame for one topic; per batch and per camera for 2+ (with
/// the frames `pending` in the former at the end).
fn print_counts(
    tally: &Tally,
    inputs: &[Input],
    backend_name: &str,
    counts: &[vision_preproc::transport::batch_sync::CameraCounts],
    pending: u64,
) {
    let (rejected, skipped) =
        (tally.rejected.values().sum::<u64>(), tally.skipped.values().sum::<u64>());
    let kind = |i: &Input| match i.transport {
        Transport::Raw => String::new(),
        t => format!(" ({})", t.name()),
    };
    if inputs.len() >= 2 {
        println!("  {} cameras, backend {backend_name}", inputs.len());
        println!(
            "  frames {}: {} batches, {} padded (stale) slots, rejected {rejected}, skipped \
             {skipped}, left unbatched at the end {pending}",
            tally.frames, tally.sets, tally.stale_slots
        );
        for (i, c) in counts.iter().enumerate() {
            println!(
                "    {}{}: received {}, batched {}, dropped {}",
                inputs[i].name,
                kind(&inputs[i]),
                c.received,
                c.batched,
                c.dropped
            );
        }
    } else {
        println!("  topic {}{}, backend {backend_name}", inputs[0].name, kind(&inputs[0]));
        println!(
            "  frames {}: published {}, rejected {rejected}, skipped {skipped}",
            tally.frames, tally.sets
        );
    }
}

/// How a recorded frame's bytes are laid out.
enum Layout {
    /// `sensor_msgs/Image` rows.
    Raw { width: u32, height: u32, step: u32, big_endian: bool },
    /// A `sensor_msgs/CompressedImage` payload (its headers read when the set was formed).
    Compressed,
    /// A frame out of a video topic's decoder.
    Decoded,
}

/// One recorded frame of a set, decoded once: its message's fields and where its pixels
/// (or compressed payload) are in the recorded message.
struct DecodedFrame {
    header: Header,
    /// `sensor_msgs/Image`'s encoding, or a compressed image's `format` (the tensor's
    /// `source_encoding`, as the node publishes it).
    encoding: String,
    layout: Layout,
    data: Range<usize>,
    /// It was in an earlier set.
    repeated: bool,
}

impl DecodedFrame {
    /// The frame, checked again in the bytes of its message (or the decoded frame).
    fn view<'a>(&'a self, recorded: &'a Recorded) -> Option<FrameView<'a>> {
        let cdr = match recorded {
            Recorded::Message(cdr) => cdr,
            Recorded::Decoded { frame, .. } => return frame.view().map(FrameView::Pixels),
        };
        let data = cdr.get(self.data.clone())?;
        match self.layout {
            Layout::Raw { width, height, step, big_endian } => {
                ImageView::new(width, height, step, &self.encoding, big_endian, data)
                    .ok()
                    .map(FrameView::Pixels)
            }
            Layout::Compressed => Compressed::probe(&self.encoding, data, &Limits::default())
                .ok()
                .map(FrameView::Compressed),
            Layout::Decoded => None,
        }
    }
}

/// A recorded message of input `slot` read as a frame: its fields, or why it is not one
/// (the rejection is counted in `tally` unless the frame is `repeated`).
fn read_frame(
    cdr: &[u8],
    (topics, compressed): (&[String], &[bool]),
    slot: usize,
    repeated: bool,
    tally: &mut Tally,
) -> Option<DecodedFrame> {
    let undecodable = |tally: &mut Tally, e: String| {
        Tally::count(&mut tally.skipped, topics, slot, format!("undecodable message: {e}"));
    };
    let (header, encoding, layout, data) = if compressed[slot] {
        let msg = match CompressedImage::decode(cdr) {
            Ok(m) => m,
            Err(e) => {
                undecodable(tally, e.to_string());
                return None;
            }
        };
        if let Err(e) = Compressed::probe(&msg.format, msg.data, &Limits::default()) {
            if !repeated {
                tally.undecodable(topics, slot, &e);
            }
            return None;
        }
        (msg.header, msg.format, Layout::Compressed, msg.data)
    } else {
        let img = match Image::decode(cdr) {
            Ok(img) => img,
            Err(e) => {
                undecodable(tally, e.to_string());
                return None;
            }
        };
        let big_endian = img.is_bigendian != 0;
        let (width, height, step) = (img.width, img.height, img.step);
        if let Err(e) = ImageView::new(width, height, step, &img.encoding, big_endian, img.data) {
            if !repeated {
                Tally::count(&mut tally.rejected, topics, slot, e.to_string());
            }
            return None;
        }
        (img.header, img.encoding, Layout::Raw { width, height, step, big_endian }, img.data)
    };
    // The bytes' place in the message they were decoded from.
    let start = data.as_ptr() as usize - cdr.as_ptr() as usize;
    Some(DecodedFrame { header, encoding, layout, data: start..start + data.len(), repeated })
}

/// A formed set of recorded frames in the pipeline: decoded when it is formed (what
/// cannot be decoded, or is not a valid image, is counted then and padded), read again
/// only if the backend must run it again.
struct RecordedSet<'t> {
    batch: Batch<Recorded>,
    /// Per slot: its frame (`None`: stale, undecodable or invalid).
    frames: Vec<Option<DecodedFrame>>,
    topics: &'t [String],
    /// The bag's time to write its messages at.
    log_time: u64,
    /// When it was formed (its FrameTiming's `total_us` counts from here).
    formed_at: Instant,
}

impl<'t> RecordedSet<'t> {
    /// Decode and check the frames of `batch` (per slot: its topic, and whether it is a
    /// compressed one), counting in `tally` what is padded.
    fn new(
        batch: Batch<Recorded>,
        log_time: u64,
        (topics, compressed): (&'t [String], &[bool]),
        tally: &mut Tally,
    ) -> Self {
        let formed_at = Instant::now();
        let frames = batch
            .items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let Item::Frame { frame, repeated } = item else {
                    tally.stale_slots += 1;
                    return None;
                };
                match &*frame.data {
                    Recorded::Message(cdr) => {
                        read_frame(cdr, (topics, compressed), i, *repeated, tally)
                    }
                    Recorded::Decoded { frame, header } => Some(DecodedFrame {
                        header: header.clone(),
                        encoding: frame.encoding().name().to_string(),
                        layout: Layout::Decoded,
                        data: 0..0,
                        repeated: *repeated,
                    }),
                }
            })
            .collect();
        RecordedSet { batch, frames, topics, log_time, formed_at }
    }
}

impl FrameSet for RecordedSet<'_> {
    fn with_inputs<R>(&self, f: impl FnOnce(&[FrameInput<'_, '_>]) -> R) -> R {
        let views: Vec<Option<FrameView<'_>>> = self
            .batch
            .items
            .iter()
            .zip(&self.frames)
            .map(|(item, d)| {
                let (Item::Frame { frame, .. }, Some(d)) = (item, d) else { return None };
                d.view(&frame.data)
            })
            .collect();
        let empty = Header::default();
        let inputs: Vec<FrameInput<'_, '_>> = self
            .frames
            .iter()
            .zip(&views)
            .enumerate()
            .map(|(i, (d, v))| FrameInput {
                topic: &self.topics[i],
                image: v.as_ref().map(FrameView::frame),
                header: d.as_ref().map_or(&empty, |d| &d.header),
                source_encoding: d.as_ref().map_or("", |d| d.encoding.as_str()),
                repeated: d.as_ref().is_some_and(|d| d.repeated),
            })
            .collect();
        f(&inputs)
    }
}

/// A set that left the pipeline: its message and FrameTiming written at its log time, or
/// its refusal counted (another error ends the replay).
fn write_set(
    finished: Finished<RecordedSet<'_>>,
    out: &mut BagWriter,
    (t_tensor, t_timing): (usize, usize),
    tally: &mut Tally,
    backend_name: &str,
) -> vision_preproc::Result<()> {
    let Finished { set, result } = finished;
    let (info, message) = match result {
        Ok(done) => done,
        Err(Error::Image(e)) => {
            // A single camera's frame that the configuration refuses (its roi).
            Tally::count(&mut tally.rejected, set.topics, 0, e.to_string());
            return Ok(());
        }
        Err(Error::Decode(e)) if set.topics.len() < 2 => {
            // A compressed frame whose headers were fine but whose data did not decode.
            tally.undecodable(set.topics, 0, &e);
            return Ok(());
        }
        Err(Error::Decode(e)) => {
            // A batch: the decoder does not say which slot failed; the set's new frames
            // are lost with it (as in the node, which counts them failed).
            *tally.undecodable.entry(e.kind()).or_default() += 1;
            let why = format!("a compressed frame of the set did not decode ({})", e.kind());
            tally.first_message.entry(why.clone()).or_insert_with(|| e.to_string());
            let lost = set.frames.iter().flatten().filter(|d| !d.repeated).count() as u64;
            *tally.rejected.entry(why).or_default() += lost;
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    for (i, reason) in info.rejected {
        Tally::count(&mut tally.rejected, set.topics, i, reason);
    }
    let total = set.formed_at.elapsed().as_secs_f32() * 1e6;
    let t = info.times;
    let header = set.with_inputs(set_header);
    // age_us: not meaningful offline (the stamps are from the recording), 0.
    let timing = frame_timing(&header, tally.sets, backend_name, &t, total, 0.0, 0);
    let s = &mut tally.stages;
    for (v, x) in [
        (&mut s.decode, t.decode_us),
        (&mut s.upload, t.upload_us),
        (&mut s.preprocess, t.preprocess_us),
        (&mut s.conv, t.conv_us),
        (&mut s.download, t.download_us),
        (&mut s.total, total),
    ] {
        v.push(x);
    }
    tally.sets += 1;
    out.write(t_tensor, set.log_time, message.bytes())?;
    out.write(t_timing, set.log_time, &timing.encode())?;
    Ok(())
}

pub fn run(args: ReplayArgs) -> Result<()> {
    let mut cfg = args.config.load()?;
    if let Some(b) = &args.backend {
        cfg.backend = serde_yaml::from_str::<BackendChoice>(b)
            .with_context(|| format!("--backend {b}: use auto, cuda or cpu"))?;
    }
    let bag = Bag::open(&args.input)?;
    // Input i as a recording of the node's topics names it: `/<input>`, or
    // `/<input>/<transport>` for another transport (`compressed`, `foxglove`, `ffmpeg`).
    let recorded = |i: usize| {
        let input = cfg.inputs.get(i).map_or("image", String::as_str);
        let t = format!("/{}", input.trim_start_matches('/'));
        match cfg.input_transport(i) {
            Transport::Raw => t,
            other => format!("{}/{}", t.trim_end_matches('/'), other.name()),
        }
    };
    let names: Vec<String> = if args.topic.len() >= 2 {
        args.topic.clone()
    } else if args.topic.is_empty() && cfg.is_batch() {
        (0..cfg.inputs.len()).map(recorded).collect()
    } else if let Some(t) = args.topic.first() {
        vec![bag.image_topic(Some(t))?.name]
    } else {
        // One camera: the configured input with its transport where the bag has it (a
        // dataset may hold `image_raw` and `image_raw/compressed`), else the bag's only
        // image topic.
        match bag.image_topic(Some(&recorded(0))) {
            Ok(info) => vec![info.name],
            Err(_) => vec![bag.image_topic(None)?.name],
        }
    };
    let inputs = names
        .into_iter()
        .map(|t| {
            let info = bag.image_topic(Some(&t))?;
            let transport = info.transport().unwrap_or(Transport::Raw);
            Ok(Input { compressed: info.is_compressed_image(), transport, name: info.name })
        })
        .collect::<Result<Vec<_>>>()?;
    replay(&args, cfg, &bag, &inputs)
}
