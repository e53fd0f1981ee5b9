//! Video packets decoded inside the node (docs/VIDEO.md): one decode pipeline per video
//! input, `appsrc ! <parser> ! <decoder> ! ...` ended by our appsink like any `gst:`
//! pipeline ([`CaptureSource`]), so its frames are one more source of frames into the
//! same path.
//!
//! ```text
//! subscription (spin thread)         VideoFeed::push(packet)      probe, key frame, gaps,
//!                                                                  start the pipeline at a key frame
//! the input's thread (ros/node/,      VideoFrames::step           the newest pipeline (taken with
//!   or replay's loop)                                              VideoFeed::take_started), its
//!                                                                  decoded frames in presentation
//!                                                                  order, PTS = the packet's stamp
//! ```
//!
//! **The decoder** is chosen per codec by [`choose_decoder`] from `video_decoder` and what
//! the machine has registered (one function: the start-up log, `info` and `/diagnostics`
//! say its choice and why).
//!
//! **A stream, not a picture.** The feed starts its pipeline at the first key frame that
//! carries (or follows) its parameter sets; packets before it are counted "waiting for a
//! key frame". A packet refused by its bytes ([`crate::video::PacketError`]), a gap in
//! FFMPEGPacket's `pts` and a decoder fault each send the stream back to waiting for the
//! next key frame (the decoder must not see a stream with a hole in it). A codec change
//! starts a new pipeline at the new codec's first key frame; a size change within a codec
//! is the decoder's own renegotiation. Stamps: each packet's buffer carries its message's
//! stamp as its PTS, and decoders reorder PTS with the frames, so B-frames come out in
//! presentation order with their own stamps.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use gstreamer as gst;
use gstreamer_app as gst_app;

use super::cuda::GpuShare;
use super::fault::debian_package;
use super::source::CaptureSource;
use crate::compressed::Limits;
use crate::config::VideoDecoder;
use crate::error::{CaptureError, Error, Result};
use crate::video::{probe, Codec, Probe};

use super::frame::Frame;
use super::video_types::SRC_NAME;
pub use super::video_types::{DecoderChoice, Outcome, Packet, Step, VideoCounts, VideoReport};

/// The largest reorder depth taken for B-frames (H.264 allows 16 frames); a `pts` further
/// below the highest starts a new count (a publisher started again).
const MAX_REORDER: u64 = 16;

/// The decoder elements of `codec`: (parser, CPU decoder, NVIDIA decoder).
fn elements(codec: Codec) -> (&'static str, &'static str, &'static str) {
    match codec {
        Codec::H264 => ("h264parse", "avdec_h264", "nvh264dec"),
        Codec::H265 => ("h265parse", "avdec_h265", "nvh265dec"),
        Codec::Vp9 => ("vp9parse", "avdec_vp9", "nvvp9dec"),
        Codec::Av1 => ("av1parse", "av1dec", "nvav1dec"),
    }
}

fn registered(element: &str) -> bool {
    gst::ElementFactory::find(element).is_some()
}

/// The decoder of `codec` under `policy` on this machine, or why there is none (a missing
/// element named with its package). The one place that chooses: NVIDIA's `nvcodec`
/// (`auto` where registered, `nvidia`), the Jetson's `nvv4l2decoder` (`jetson` only), else
/// the CPU's (gstreamer1.0-libav's `avdec_*`, AV1 `av1dec`), each output as NV12 in system
/// memory.
pub fn choose_decoder(codec: Codec, policy: VideoDecoder) -> Result<DecoderChoice, CaptureError> {
    gst::init().map_err(|e| CaptureError::Init(e.to_string()))?;
    let (parser, cpu, nvidia) = elements(codec);
    let missing = |element: &str| CaptureError::NoSuchElement {
        element: element.to_string(),
        package: debian_package(element).to_string(),
    };
    if !registered(parser) {
        return Err(missing(parser));
    }
    let choice = |decoder: &'static str, tail: String, why: String| DecoderChoice {
        codec,
        parser,
        decoder,
        tail,
        why,
    };
    match policy {
        VideoDecoder::Nvidia | VideoDecoder::Auto if registered(nvidia) => Ok(choice(
            nvidia,
            format!("{nvidia} ! video/x-raw,format=NV12"),
            format!("video_decoder {}: NVIDIA's {nvidia} (NVDEC) is registered", policy.name()),
        )),
        VideoDecoder::Nvidia => Err(missing(nvidia)),
        VideoDecoder::Jetson if registered("nvv4l2decoder") && registered("nvvidconv") => {
            Ok(choice(
                "nvv4l2decoder",
                "nvv4l2decoder ! nvvidconv ! video/x-raw,format=NV12".to_string(),
                "video_decoder jetson: nvv4l2decoder (NVMM), brought to system memory by \
                 nvvidconv (untested: written from NVIDIA's documentation)"
                    .to_string(),
            ))
        }
        VideoDecoder::Jetson => {
            Err(missing(if registered("nvv4l2decoder") { "nvvidconv" } else { "nvv4l2decoder" }))
        }
        VideoDecoder::Cpu | VideoDecoder::Auto if registered(cpu) => Ok(choice(
            cpu,
            cpu_tail(cpu),
            if policy == VideoDecoder::Auto {
                format!("video_decoder auto: the CPU's {cpu} ({nvidia} is not registered here)")
            } else {
                format!("video_decoder cpu: {cpu} ({})", debian_package(cpu))
            },
        )),
        VideoDecoder::Cpu | VideoDecoder::Auto => Err(missing(cpu)),
    }
}

/// A CPU decoder and the conversion of its planar 4:2:0 output to NV12 (no colour
/// conversion: the chroma planes interleaved), which the kernels read.
fn cpu_tail(decoder: &str) -> String {
    // libav's decoders output frames with concealed errors unless told not to.
    let props = if decoder.starts_with("avdec_") { " output-corrupt=false" } else { "" };
    format!("{decoder}{props} ! videoconvert ! video/x-raw,format=NV12")
}

/// What `vision_preproc info` says of the video decoders under `policy`: per codec the
/// decoder chosen, or why none.
pub fn decoders_status(policy: VideoDecoder) -> String {
    Codec::ALL
        .iter()
        .map(|&c| match choose_decoder(c, policy) {
            Ok(d) => format!("{c} {} ({})", d.decoder, d.why),
            Err(e) => format!("{c} refused ({e})"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The running decode pipeline's input.
struct Running {
    codec: Codec,
    src: gst_app::AppSrc,
    generation: u64,
}

#[derive(Default)]
struct State {
    running: Option<Running>,
    /// A pipeline started by `push`, not yet taken by the input's thread.
    started: Option<(CaptureSource, u64)>,
    generation: u64,
    /// The stream waits for a key frame (at the start, after a refusal, gap or fault).
    resync: bool,
    /// The newest parameter sets seen, for a key frame that comes without them.
    parameter_sets: Vec<u8>,
    /// The highest FFMPEGPacket `pts` seen.
    last_sequence: Option<u64>,
    /// How far below the highest a `pts` has arrived (B-frames' reorder depth).
    reorder_depth: u64,
    frame_id: String,
    report: VideoReport,
}

/// A video input's packets on their way into its decode pipeline, shared by the thread
/// that receives them ([`VideoFeed::push`]) and the one that takes the frames
/// ([`VideoFeed::take_started`], [`VideoFeed::fault`]).
pub struct VideoFeed {
    policy: VideoDecoder,
    limits: Limits,
    /// The GPU backend's CUDA context, shared with the decode pipelines: NVIDIA's
    /// decoders then output CUDA memory, read in place.
    gpu: Option<Arc<GpuShare>>,
    state: Mutex<State>,
    changed: Condvar,
}

impl std::fmt::Debug for VideoFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VideoFeed")
            .field("policy", &self.policy)
            .field("report", &self.lock().report)
            .finish()
    }
}

impl VideoFeed {
    /// A feed whose decoders are chosen under `policy`, refusing pictures over `limits`.
    pub fn new(policy: VideoDecoder, limits: Limits) -> VideoFeed {
        let state = State { resync: true, ..State::default() };
        VideoFeed { policy, limits, gpu: None, state: Mutex::new(state), changed: Condvar::new() }
    }

    /// The feed with the GPU backend's CUDA context shared with its decode pipelines
    /// (`None`: the CPU backend, or no GStreamer CUDA library): NVIDIA's decoders' frames
    /// then stay in CUDA memory and the backend reads them in place.
    pub fn with_gpu(mut self, gpu: Option<Arc<GpuShare>>) -> VideoFeed {
        self.gpu = gpu;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take one packet: refused by cause, dropped while waiting for a key frame, or pushed
    /// into the decode pipeline (started at a key frame when none runs for its codec).
    pub fn push(&self, packet: &Packet<'_>) -> Outcome {
        let mut st = self.lock();
        st.report.counts.received += 1;
        st.frame_id.clear();
        st.frame_id.push_str(packet.frame_id);
        let Some(codec) = packet.codec else {
            let why = format!(
                "format `{}` names no video codec: give h264, h265, vp9 or av1",
                packet.format
            );
            return refuse(&mut st, "unknown codec", why);
        };
        let probe = match probe(codec, packet.data, &self.limits) {
            Ok(p) => p,
            Err(e) => return refuse(&mut st, e.kind(), e.to_string()),
        };
        if probe.size.is_some() {
            st.report.size = probe.size;
        }
        sequence_gap(&mut st, packet.sequence);
        if st.running.as_ref().is_some_and(|r| r.codec != codec) {
            // A new codec: its own pipeline from its first key frame.
            end_stream(&mut st);
        }
        let needs_sets = matches!(codec, Codec::H264 | Codec::H265);
        if !probe.parameter_sets.is_empty() {
            st.parameter_sets.clone_from(&probe.parameter_sets);
        }
        if st.resync {
            let startable = probe.key && (!needs_sets || !st.parameter_sets.is_empty());
            if !startable {
                st.report.counts.waiting += 1;
                st.report.waiting = true;
                return Outcome::Waiting;
            }
        }
        if st.running.is_none() {
            if let Err(e) = self.start(&mut st, codec) {
                return refuse(&mut st, "no decoder", e.to_string());
            }
        }
        self.feed(&mut st, packet, &probe, needs_sets)
    }

    /// Push the packet's bytes (a key frame without its parameter sets after the last
    /// ones seen) with its stamp as PTS.
    fn feed(
        &self,
        st: &mut State,
        packet: &Packet<'_>,
        probe: &Probe,
        needs_sets: bool,
    ) -> Outcome {
        let Some(running) = st.running.as_ref() else {
            return Outcome::Waiting;
        };
        let mut bytes = Vec::with_capacity(packet.data.len() + st.parameter_sets.len());
        if st.resync && needs_sets && !probe.has_sps {
            bytes.extend_from_slice(&st.parameter_sets);
        }
        bytes.extend_from_slice(packet.data);
        let mut buffer = gst::Buffer::from_mut_slice(bytes);
        if let Some(b) = buffer.get_mut() {
            b.set_pts(gst::ClockTime::from_nseconds(packet.stamp_ns));
        }
        match running.src.push_buffer(buffer) {
            Ok(_) => {
                st.resync = false;
                st.report.waiting = false;
                st.report.counts.decoding += 1;
                Outcome::Decoding
            }
            Err(flow) => {
                // The pipeline stopped (its thread reports the fault): start again at the
                // next key frame.
                st.running = None;
                st.resync = true;
                refuse(st, "decoder stopped", format!("the decode pipeline refused it ({flow:?})"))
            }
        }
    }

    /// Start a decode pipeline for `codec` and hand it to the input's thread.
    fn start(&self, st: &mut State, codec: Codec) -> Result<()> {
        let mut choice = choose_decoder(codec, self.policy).map_err(|fault| Error::Capture {
            description: format!("(video input, {codec})"),
            fault,
        })?;
        if self.gpu.is_some() {
            choice = choice.in_cuda_memory();
        }
        let source = CaptureSource::start_fed(&choice.description(), self.gpu.clone())?;
        let src = source.app_src(SRC_NAME).ok_or_else(|| Error::Capture {
            description: choice.description(),
            fault: CaptureError::Link { message: format!("our appsrc `{SRC_NAME}` is missing") },
        })?;
        st.generation += 1;
        st.running = Some(Running { codec, src, generation: st.generation });
        st.started = Some((source, st.generation));
        st.report.decoder = Some(choice);
        st.report.counts.starts += 1;
        self.changed.notify_all();
        Ok(())
    }

    /// The pipeline started since the last call (with its generation, for
    /// [`VideoFeed::fault`]), waiting up to `timeout` for one.
    pub fn take_started(&self, timeout: Duration) -> Option<(CaptureSource, u64)> {
        let mut st = self.lock();
        if st.started.is_none() {
            st = self
                .changed
                .wait_timeout(st, timeout)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        st.started.take()
    }

    /// The pipeline of `generation` failed or ended (`what`). The running one's fault is
    /// counted and the stream waits for its next key frame: true. A pipeline retired by a
    /// codec change ends after its last frame (its end of stream): false, not a fault.
    pub fn fault(&self, generation: u64, what: &str) -> bool {
        let mut st = self.lock();
        if st.running.as_ref().is_none_or(|r| r.generation != generation) {
            return false;
        }
        st.running = None;
        st.resync = true;
        st.report.waiting = true;
        st.report.counts.faults += 1;
        st.report.last_problem = Some(format!("decoder fault: {what}"));
        true
    }

    /// Packets are not taken for a while (the managed node is not active): the stream
    /// waits for a key frame when they are again.
    pub fn pause(&self) {
        let mut st = self.lock();
        st.resync = true;
        st.report.waiting = true;
    }

    /// No more packets (the end of a bag): the running pipeline is told its stream ended,
    /// so its decoder hands out the frames it still holds, and its end is not a fault.
    pub fn finish(&self) {
        end_stream(&mut self.lock());
    }

    /// A frame came out of the decoder.
    pub fn decoded(&self) {
        self.lock().report.counts.frames += 1;
    }

    /// The frame_id of the newest packet.
    pub fn frame_id(&self) -> String {
        self.lock().frame_id.clone()
    }

    /// Packets pushed into the decoder and not out as frames yet (held for reordering,
    /// being decoded, or dropped by the decoder).
    pub fn in_decoder(&self) -> u64 {
        let c = &self.lock().report.counts;
        c.decoding.saturating_sub(c.frames)
    }

    /// A snapshot for `/diagnostics`.
    pub fn report(&self) -> VideoReport {
        self.lock().report.clone()
    }
}

/// The decoded frames of a feed's pipelines, in order, for the one thread that takes them
/// (the node's per video input, `replay`'s): the newest pipeline taken from the feed, a
/// pipeline replaced by a codec change drained first (its frames until its end of stream,
/// or until it gives none for one wait), a pipeline's error or end told to the feed
/// ([`VideoFeed::fault`]). Dropping it stops the pipelines it holds.
pub struct VideoFrames {
    feed: Arc<VideoFeed>,
    current: Option<(CaptureSource, u64)>,
    next: Option<(CaptureSource, u64)>,
}

impl VideoFrames {
    /// The frames of `feed`'s pipelines.
    pub fn new(feed: Arc<VideoFeed>) -> VideoFrames {
        VideoFrames { feed, current: None, next: None }
    }

    /// One step, waiting up to `wait`: a frame (counted out of the decoder), a pipeline
    /// taken, the running pipeline's fault, or nothing.
    pub fn step(&mut self, wait: Duration) -> Step<Frame> {
        if self.next.is_none() {
            let w = if self.current.is_some() { Duration::ZERO } else { wait };
            self.next = self.feed.take_started(w);
        }
        if self.current.is_none() && self.next.is_some() {
            self.current = self.next.take();
            return Step::Started;
        }
        let Some((source, generation)) = self.current.as_mut() else { return Step::Idle };
        let (step, ended) = match source.next(wait) {
            Ok(Some(frame)) => {
                self.feed.decoded();
                (Step::Frame(frame), false)
            }
            Ok(None) => (Step::Idle, self.next.is_some()),
            Err(e) => {
                let what = e.to_string();
                let counted = self.feed.fault(*generation, &what);
                (if counted { Step::Fault(what) } else { Step::Idle }, true)
            }
        };
        if ended {
            if let Some((s, _)) = self.current.take() {
                let _ = s.stop();
            }
        }
        step
    }

    /// No pipeline is held (every one taken has ended) and none was waiting to be taken
    /// at the last step.
    pub fn is_idle(&self) -> bool {
        self.current.is_none() && self.next.is_none()
    }
}

impl Drop for VideoFrames {
    fn drop(&mut self) {
        for (s, _) in [self.current.take(), self.next.take()].into_iter().flatten() {
            let _ = s.stop();
        }
    }
}

/// The running pipeline is told its stream ended, so its decoder hands out the frames it
/// still holds (its end is then no fault); the next packets wait for a key frame.
fn end_stream(st: &mut State) {
    if let Some(old) = st.running.take() {
        let _ = old.src.end_of_stream();
    }
    st.resync = true;
}

/// Refuse a packet: counted by `kind`, and the stream waits for a key frame.
fn refuse(st: &mut State, kind: &'static str, why: String) -> Outcome {
    *st.report.counts.refused.entry(kind).or_default() += 1;
    st.report.last_problem = Some(why.clone());
    st.resync = true;
    st.report.waiting = true;
    Outcome::Refused(why)
}

/// A gap in FFMPEGPacket's `pts` (a packet lost before the node): counted, and the stream
/// waits for a key frame (this packet, if it is one). Packets come in decode order:
/// without B-frames each `pts` is one more than the highest so far; with B-frames a
/// reference frame jumps ahead by the stream's reorder depth and the B-frames fill in
/// below it. The depth is learned from the `pts` that arrive below the highest (kept for
/// the stream's life), and a jump of more than one plus that depth is a gap. (So the first
/// jump of a stream with B-frames, before any has arrived, counts as a gap once.)
fn sequence_gap(st: &mut State, sequence: Option<u64>) {
    let Some(pts) = sequence else { return };
    let Some(last) = st.last_sequence else {
        st.last_sequence = Some(pts);
        return;
    };
    if last - pts.min(last) > MAX_REORDER {
        // Far below: a publisher that started again counts from its own start.
        st.last_sequence = Some(pts);
        return;
    }
    if pts <= last {
        st.reorder_depth = st.reorder_depth.max(last - pts);
        return;
    }
    st.last_sequence = Some(pts);
    if st.resync || pts - last <= 1 + st.reorder_depth {
        return;
    }
    st.report.counts.gaps += 1;
    st.report.last_problem = Some(format!(
        "{} packet(s) lost before the node (pts jumped from {last} to {pts})",
        pts - last - 1 - st.reorder_depth
    ));
    st.resync = true;
}
