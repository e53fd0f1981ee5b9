//! Video inputs (docs/VIDEO.md): `image_transport` / `input_transports` `foxglove`
//! (`foxglove_msgs/CompressedVideo` on `<topic>/foxglove`), `ffmpeg`
//! (`ffmpeg_image_transport_msgs/FFMPEGPacket` on `<topic>/ffmpeg`), and `compressed`
//! messages whose format is `h264` or `h265` (Isaac ROS's encoder). The subscription hands
//! each packet to the input's [`VideoFeed`] (`capture/video.rs`: key frames, gaps, the
//! decode pipeline started at a key frame); a thread per input takes the decoded frames
//! from the pipeline's appsink and pushes them into the same frame-set former as every
//! other frame, read in place like a `gst:` camera's, each stamped with the stamp of the
//! packet that carried it (presentation order: B-frames included) and the newest
//! packet's frame_id.

use super::former::Former;
use super::shared::{lock, Captured, Pixels, RateLimitedLog, Received, Shared};
use crate::capture::{
    decoders_status, Frame, GpuShare, Outcome, Packet, Step, VideoFeed, VideoFrames,
};
use crate::compressed::Limits;
use crate::config::{Config, InputSource, Transport};
use crate::error::{Error, Result};
use crate::video::Codec;
use crate::wire::msgs::Header;
use r2r::ffmpeg_image_transport_msgs::msg::FFMPEGPacket;
use r2r::foxglove_msgs::msg::CompressedVideo;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the decoding thread waits for a frame (or a pipeline) before it looks at the
/// stop flag.
const POLL: Duration = Duration::from_millis(100);

/// A video message as the subscription delivers it.
pub(super) enum VideoMsg {
    /// `foxglove_msgs/CompressedVideo`.
    Foxglove(CompressedVideo),
    /// `ffmpeg_image_transport_msgs/FFMPEGPacket`.
    Ffmpeg(FFMPEGPacket),
}

fn stamp_ns(sec: i32, nanosec: u32) -> u64 {
    u64::try_from(i64::from(sec) * 1_000_000_000 + i64::from(nanosec)).unwrap_or(0)
}

impl VideoMsg {
    /// The packet it carries.
    pub(super) fn packet(&self) -> Packet<'_> {
        match self {
            VideoMsg::Foxglove(m) => Packet {
                format: &m.format,
                codec: Codec::from_format(&m.format),
                data: &m.data,
                stamp_ns: stamp_ns(m.timestamp.sec, m.timestamp.nanosec),
                frame_id: &m.frame_id,
                sequence: None,
            },
            VideoMsg::Ffmpeg(m) => Packet {
                format: &m.encoding,
                codec: Codec::from_format(&m.encoding),
                data: &m.data,
                stamp_ns: stamp_ns(m.header.stamp.sec, m.header.stamp.nanosec),
                frame_id: &m.header.frame_id,
                sequence: Some(m.pts),
            },
        }
    }
}

/// A `compressed` message's packet when its format names a video codec (else `None`: a
/// JPEG or PNG, decoded by the backend).
pub(super) fn compressed_packet<'a>(
    format: &'a str,
    data: &'a [u8],
    header: &'a Header,
) -> Option<Packet<'a>> {
    let codec = Codec::from_format(format)?;
    Some(Packet {
        format,
        codec: Some(codec),
        data,
        stamp_ns: stamp_ns(header.sec, header.nanosec),
        frame_id: &header.frame_id,
        sequence: None,
    })
}

/// The batch slots of `config`'s topic inputs whose transport carries video (`foxglove`,
/// `ffmpeg`, and `compressed`, whose messages may).
fn video_inputs(config: &Config) -> Vec<usize> {
    let sources = config.input_sources();
    let video = |i| {
        matches!(
            config.input_transport(i),
            Transport::Foxglove | Transport::Ffmpeg | Transport::Compressed
        )
    };
    (0..sources.len())
        .filter(|&i| matches!(sources[i], InputSource::Topic(_)) && video(i))
        .collect()
}

/// Whether `config` has an input that may carry video.
pub(super) fn has_video_inputs(config: &Config) -> bool {
    !video_inputs(config).is_empty()
}

/// The video feeds of `config`, one per input that may carry video, by batch slot; their
/// decode pipelines share `gpu` (NVIDIA's decoders then output CUDA memory).
pub(super) fn feeds(config: &Config, gpu: Option<&Arc<GpuShare>>) -> Vec<(usize, Arc<VideoFeed>)> {
    video_inputs(config)
        .into_iter()
        .map(|i| {
            let feed = VideoFeed::new(config.video_decoder, Limits::default());
            (i, Arc::new(feed.with_gpu(gpu.cloned())))
        })
        .collect()
}

/// Say on the log how the video inputs are decoded here.
pub(super) fn log_decoders(logger: &str, config: &Config, feeds: &[(usize, Arc<VideoFeed>)]) {
    for (i, _) in feeds {
        let transport = config.input_transport(*i);
        if transport == Transport::Compressed {
            continue;
        }
        r2r::log_info!(
            logger,
            "input {i}: video packets ({}) decoded in the node from the first key frame; \
             decoders (video_decoder {}): {}",
            transport.name(),
            config.video_decoder.name(),
            decoders_status(config.video_decoder)
        );
    }
}

/// Take one packet of input `index` (counted by its delivery monitor) into its feed; a
/// refusal is logged (rate-limited). The managed node while not active takes none (as the
/// former takes no frame): the stream waits for a key frame once it is active again.
pub(super) fn take(
    shared: &Shared,
    index: usize,
    (feed, log): (&VideoFeed, &mut RateLimitedLog),
    packet: &Packet<'_>,
    at: Instant,
) {
    if !shared.is_active() {
        feed.pause();
        return;
    }
    {
        let mut input = lock(&shared.inputs[index]);
        input.monitor.image(at, packet.stamp_ns as i64, packet.data.len());
    }
    if let Outcome::Refused(why) = feed.push(packet) {
        log.warn(
            &shared.logger,
            &format!(
                "input {index}: video packet refused: {why}; the stream resumes at the next \
                 key frame"
            ),
        );
    }
}

/// The decoding threads of the video inputs: dropping it stops them (pipelines to NULL,
/// threads joined).
pub(super) struct Decoders {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Decoders {
    /// One thread per feed, pushing its decoded frames into `former`.
    pub(super) fn run(
        feeds: &[(usize, Arc<VideoFeed>)],
        former: &Arc<Mutex<Former>>,
        shared: &Arc<Shared>,
    ) -> Result<Decoders> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (index, feed) in feeds {
            let decoding = Decoding {
                index: *index,
                feed: feed.clone(),
                former: former.clone(),
                shared: shared.clone(),
                stop: stop.clone(),
                log: RateLimitedLog::new(&shared.clock),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("video-{index}"))
                    .spawn(move || decoding.run())
                    .map_err(|e| Error::io(format!("starting the decoder of input {index}"), e))?,
            );
        }
        Ok(Decoders { stop, threads })
    }
}

impl Drop for Decoders {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One video input's decoding thread.
struct Decoding {
    index: usize,
    feed: Arc<VideoFeed>,
    former: Arc<Mutex<Former>>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    log: RateLimitedLog,
}

impl Decoding {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.shared.is_stopped()
    }

    /// Take the feed's frames ([`VideoFrames`]: the newest pipeline, one replaced by a
    /// codec change drained first) into the former until the node stops; a pipeline's
    /// start and fault are logged.
    fn run(mut self) {
        let mut frames = VideoFrames::new(self.feed.clone());
        while !self.stopping() {
            match frames.step(POLL) {
                Step::Frame(frame) => self.deliver(frame),
                Step::Started => self.log_start(),
                Step::Fault(what) => self.log.warn(
                    &self.shared.logger,
                    &format!(
                        "input {}: video decoder: {what}; decoding starts again at the next key \
                         frame",
                        self.index
                    ),
                ),
                Step::Idle => {}
            }
        }
    }

    /// The start-up line of a decode pipeline: codec, size, decoder and why.
    fn log_start(&self) {
        let report = self.feed.report();
        let Some(d) = report.decoder else { return };
        let size = report.size.map(|(w, h)| format!(" {w}x{h}")).unwrap_or_default();
        r2r::log_info!(
            &self.shared.logger,
            "input {}: {}{size} stream from a key frame: decoder {} ({}); pipeline `{}`",
            self.index,
            d.codec,
            d.decoder,
            d.why,
            d.description()
        );
    }

    /// The frame into the former, stamped with its packet's stamp.
    fn deliver(&mut self, frame: Frame) {
        let at = Instant::now();
        let ns = frame.pts_ns().unwrap_or(0);
        let header = Header {
            sec: i32::try_from(ns / 1_000_000_000).unwrap_or(i32::MAX),
            nanosec: (ns % 1_000_000_000) as u32,
            frame_id: self.feed.frame_id(),
        };
        let captured = Captured { frame: Arc::new(frame), header };
        let received = Received::new(Pixels::Captured(captured), at);
        let mut former = lock(&self.former);
        former.push(self.index, received, &self.shared);
        former.poll(&self.shared);
    }
}
