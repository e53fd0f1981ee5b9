//! `replay`'s video packets (docs/VIDEO.md): a foxglove (`CompressedVideo`) or ffmpeg
//! (`FFMPEGPacket`) topic's messages, and a compressed topic's whose format names a video
//! codec (`h264`, `h265`), through the node's decode path: the topic's [`VideoFeed`] (the
//! stream started at its first key frame, packets before it counted waiting for one,
//! refusals by cause, gaps in `pts`, the decoder chosen by `video_decoder`) and its
//! [`VideoFrames`] (the decoded frames in presentation order, each stamped with its
//! packet's stamp and the newest packet's frame_id). Each frame is received at its
//! packet's receive time (never before the topic's previous frame): the same bag gives
//! the same frames at the same times.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vision_preproc::capture::{Frame, Packet, Step, VideoFeed, VideoFrames, VideoReport};
use vision_preproc::compressed::Limits;
use vision_preproc::config::{Transport, VideoDecoder};
use vision_preproc::video::Codec;
use vision_preproc::wire::msgs::{CompressedImage, Header, VideoPacket};

/// How long the end of a replay waits for a decoder's last frames (after its end of
/// stream) before it says what is left in it.
const END_WAIT: Duration = Duration::from_secs(10);
/// How many packets a topic's decoder may hold beyond the frames taken out of it before
/// the replay waits for its frames: the bag is read far faster than it decodes, and the
/// frames that pile up meanwhile (3 MB each at 1080p) are memory; B-frames' reorder depth
/// and the decoder's frame threads hold a few packets each.
const MAX_AHEAD: u64 = 8;
/// How long one wait for a frame lasts: a decoder that gives none in this time holds more
/// than [`MAX_AHEAD`] packets (a deeper reorder, more threads) or dropped some (a frame
/// libav knows to be corrupt), and the replay stops waiting for those.
const PACE_WAIT: Duration = Duration::from_millis(500);

/// A frame out of a topic's decoder.
pub struct Decoded {
    /// The frame, in system memory.
    pub frame: Frame,
    /// Its packet's stamp, and the newest packet's frame_id.
    pub header: Header,
    /// When it is received: its packet's receive time (ns).
    pub received: u64,
}

/// A message of a video topic, read.
pub enum Read<'a> {
    /// A video packet.
    Packet(VideoPacket<'a>),
    /// A compressed image that is no video (JPEG, PNG): the compressed path's.
    NotVideo,
}

/// The message `cdr` of a topic of `transport`, as a video packet.
pub fn read(cdr: &[u8], transport: Transport) -> Result<Read<'_>, String> {
    fn e(e: impl ToString) -> String {
        e.to_string()
    }
    match transport {
        Transport::Foxglove => VideoPacket::decode_foxglove(cdr).map(Read::Packet).map_err(e),
        Transport::Ffmpeg => VideoPacket::decode_ffmpeg(cdr).map(Read::Packet).map_err(e),
        _ => {
            let m = CompressedImage::decode(cdr).map_err(e)?;
            if Codec::from_format(&m.format).is_none() {
                return Ok(Read::NotVideo);
            }
            Ok(Read::Packet(VideoPacket {
                header: m.header,
                format: m.format,
                pts: None,
                data: m.data,
            }))
        }
    }
}

/// One topic's decode path and the receive times of its packets.
pub struct VideoTopic {
    feed: Arc<VideoFeed>,
    frames: VideoFrames,
    /// Receive time of each packet pushed into the decoder, by its stamp.
    times: BTreeMap<u64, u64>,
    /// The receive time of the topic's latest frame.
    last: u64,
    /// Messages that were not CDR of their type, and the first one's error.
    undecodable: u64,
    first_undecodable: Option<String>,
    /// Frames the decoder still held when the replay ended ([`END_WAIT`]).
    pub left_in_decoder: bool,
    /// Packets the decoder holds or dropped that the replay no longer waits for
    /// ([`PACE_WAIT`]).
    unwaited: u64,
}

impl VideoTopic {
    /// A topic whose decoders are chosen under `policy`.
    pub fn new(policy: VideoDecoder) -> VideoTopic {
        let feed = Arc::new(VideoFeed::new(policy, Limits::default()));
        VideoTopic {
            frames: VideoFrames::new(feed.clone()),
            feed,
            times: BTreeMap::new(),
            last: 0,
            undecodable: 0,
            first_undecodable: None,
            left_in_decoder: false,
            unwaited: 0,
        }
    }

    /// A message that is not CDR of its type (`why`): counted, never a packet.
    pub fn not_cdr(&mut self, why: String) {
        self.undecodable += 1;
        self.first_undecodable.get_or_insert(why);
    }

    /// Push `packet` (received at `log_time`) into the feed, and take the frames the
    /// decoder has given so far, waiting for them while it holds more than [`MAX_AHEAD`]
    /// packets (the memory of a long bag stays that of a few frames).
    pub fn push(&mut self, packet: &VideoPacket<'_>, log_time: u64) -> Vec<Decoded> {
        let h = &packet.header;
        let stamp_ns = u64::try_from(h.stamp_ns()).unwrap_or(0);
        let p = Packet {
            format: &packet.format,
            codec: Codec::from_format(&packet.format),
            data: packet.data,
            stamp_ns,
            frame_id: &h.frame_id,
            sequence: packet.pts,
        };
        if self.feed.push(&p) == vision_preproc::capture::Outcome::Decoding {
            self.times.insert(stamp_ns, log_time);
        }
        let mut out = self.take(Duration::ZERO, None);
        self.pace(&mut out);
        out
    }

    /// Take frames, waiting, while the decoder holds more than [`MAX_AHEAD`] packets.
    fn pace(&mut self, out: &mut Vec<Decoded>) {
        loop {
            let ahead = self.feed.in_decoder().saturating_sub(self.unwaited);
            if ahead <= MAX_AHEAD {
                return;
            }
            match self.frames.step(PACE_WAIT) {
                Step::Frame(frame) => self.decoded(frame, out),
                Step::Started | Step::Fault(_) => {}
                Step::Idle => {
                    self.unwaited += ahead - MAX_AHEAD;
                    return;
                }
            }
        }
    }

    /// The end of the bag: the running decoder told its stream ended, and every frame it
    /// still holds taken.
    pub fn finish(&mut self) -> Vec<Decoded> {
        self.feed.finish();
        let out = self.take(Duration::from_millis(50), Some(Instant::now() + END_WAIT));
        self.left_in_decoder = !self.frames.is_idle();
        out
    }

    /// The frames out: until a step gives nothing (`until` none), or until no pipeline is
    /// held or `until` passes.
    fn take(&mut self, wait: Duration, until: Option<Instant>) -> Vec<Decoded> {
        let mut out = Vec::new();
        loop {
            match self.frames.step(wait) {
                Step::Frame(frame) => self.decoded(frame, &mut out),
                Step::Started | Step::Fault(_) => {}
                Step::Idle => match until {
                    None => break,
                    Some(t) if self.frames.is_idle() || Instant::now() > t => break,
                    Some(_) => {}
                },
            }
        }
        out
    }

    /// A frame into `out` with its header and receive time (its packet's, forgotten with
    /// those of the packets before it, whose frames are out or will not come).
    fn decoded(&mut self, frame: Frame, out: &mut Vec<Decoded>) {
        let ns = frame.pts_ns().unwrap_or(0);
        let own = self.times.get(&ns).copied();
        self.times = self.times.split_off(&ns.saturating_add(1));
        self.last = self.last.max(own.unwrap_or(self.last));
        let header = Header {
            sec: i32::try_from(ns / 1_000_000_000).unwrap_or(i32::MAX),
            nanosec: (ns % 1_000_000_000) as u32,
            frame_id: self.feed.frame_id(),
        };
        out.push(Decoded { frame, header, received: self.last });
    }

    /// The feed's counts and decoder.
    pub fn report(&self) -> VideoReport {
        self.feed.report()
    }
}

/// The summary's lines of a video topic: its messages and packets, each counted once.
pub fn summary_lines(topic: &str, v: &VideoTopic) -> Vec<String> {
    let r = v.report();
    let c = &r.counts;
    let refused: u64 = c.refused.values().sum();
    let by_cause: Vec<String> = c.refused.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let mut lines = vec![
        format!(
            "video {topic}: messages {}: undecodable {}, packets {}: decoded {}, waiting for \
             a key frame {}, refused {refused}{}",
            v.undecodable + c.received,
            v.undecodable,
            c.received,
            c.decoding,
            c.waiting,
            if by_cause.is_empty() { String::new() } else { format!(" ({})", by_cause.join(", ")) }
        ),
        format!(
            "  frames out of the decoder {}, gaps (lost packets) {}, decoder faults {}, decoder \
             starts {}{}",
            c.frames,
            c.gaps,
            c.faults,
            c.starts,
            if v.left_in_decoder { "; frames left in the decoder at the end" } else { "" }
        ),
    ];
    if let Some(d) = &r.decoder {
        let size = r.size.map(|(w, h)| format!(" {w}x{h}")).unwrap_or_default();
        lines.push(format!("  decoder: {}{size}: {} ({})", d.codec, d.decoder, d.why));
    }
    if let Some(p) = &r.last_problem {
        lines.push(format!("  last problem: {p}"));
    }
    if let Some(e) = &v.first_undecodable {
        lines.push(format!("  the first undecodable message: {e}"));
    }
    lines
}

/// `--json`'s `video` entry of a topic.
pub fn summary_json(v: &VideoTopic) -> serde_json::Value {
    let r = v.report();
    let c = &r.counts;
    serde_json::json!({
        "undecodable": v.undecodable,
        "packets": c.received,
        "decoded": c.decoding,
        "waiting": c.waiting,
        "refused": c.refused,
        "frames": c.frames,
        "gaps": c.gaps,
        "faults": c.faults,
        "starts": c.starts,
        "decoder": r.decoder.as_ref().map(|d| d.decoder),
        "size": r.size,
        "last_problem": r.last_problem,
        "left_in_decoder": v.left_in_decoder,
    })
}
