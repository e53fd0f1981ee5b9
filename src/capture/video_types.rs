//! The plain data of video inputs (`video.rs`): a packet as received, what the feed did
//! with it, its counts and report, the decoder chosen. Shared with `capture_stub.rs` (one
//! definition).

use std::collections::BTreeMap;

use crate::video::Codec;

/// How a codec is decoded on this machine: the elements between our appsrc and our
/// appsink, and why they were chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoderChoice {
    /// The codec.
    pub codec: Codec,
    /// The parser element (`h264parse`, ...).
    pub parser: &'static str,
    /// The decoder element (`avdec_h264`, `nvh264dec`, `nvv4l2decoder`, ...).
    pub decoder: &'static str,
    /// The decoder with its properties and what follows it, up to our appsink.
    pub tail: String,
    /// Why this one: the `video_decoder` value and what is registered here.
    pub why: String,
}

/// The name of our appsrc in a decode pipeline.
pub(crate) const SRC_NAME: &str = "vision_preproc_src";

impl DecoderChoice {
    /// NVIDIA's decoder with its output left in CUDA memory (no caps filter to system
    /// memory), for a pipeline that shares the GPU backend's CUDA context: our appsink
    /// prefers NV12 in CUDA memory and the backend reads it in place. Other decoders are
    /// unchanged (their output is system memory).
    pub fn in_cuda_memory(mut self) -> DecoderChoice {
        if self.decoder.starts_with("nvh26") || self.decoder.starts_with("nvvp9") {
            self.tail = self.decoder.to_string();
            self.why.push_str(
                "; output in CUDA memory, read in place by the GPU backend (its CUDA context \
                 shared with GStreamer's)",
            );
        }
        self
    }

    /// The launch description: our appsrc (live, TIME stamps, the codec's caps) and the
    /// chosen elements.
    pub fn description(&self) -> String {
        format!(
            "appsrc name={SRC_NAME} is-live=true format=time do-timestamp=false max-bytes=0 \
             caps={} ! {} ! {}",
            src_caps(self.codec),
            self.parser,
            self.tail
        )
    }
}

/// The caps our appsrc announces for `codec`: one access unit (temporal unit) per buffer.
fn src_caps(codec: Codec) -> &'static str {
    match codec {
        Codec::H264 => "video/x-h264,stream-format=byte-stream,alignment=au",
        Codec::H265 => "video/x-h265,stream-format=byte-stream,alignment=au",
        Codec::Vp9 => "video/x-vp9",
        Codec::Av1 => "video/x-av1,stream-format=obu-stream,alignment=tu",
    }
}

/// One packet of a video message, as the subscription read it.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// The message's format or encoding, as given.
    pub format: &'a str,
    /// The codec it names ([`Codec::from_format`]).
    pub codec: Option<Codec>,
    /// The packet's bytes.
    pub data: &'a [u8],
    /// The message's stamp, ns since the epoch (negative stamps as 0).
    pub stamp_ns: u64,
    /// The message's frame_id.
    pub frame_id: &'a str,
    /// FFMPEGPacket's `pts`: consecutive in a stream without B-frames, a gap is a lost
    /// packet.
    pub sequence: Option<u64>,
}

/// What the feed did with a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Pushed into the decoder.
    Decoding,
    /// Dropped: the stream waits for a key frame.
    Waiting,
    /// Refused, with the reason (the stream then waits for a key frame).
    Refused(String),
}

/// What one step of a video input's frames did (`VideoFrames::step`; generic over the
/// frame, which the build without GStreamer does not have).
#[derive(Debug)]
pub enum Step<F> {
    /// A frame out of the decoder.
    Frame(F),
    /// A new decode pipeline was taken (its decoder is in the feed's report).
    Started,
    /// The running pipeline failed or ended, with what: counted by the feed, and the
    /// stream waits for its next key frame.
    Fault(String),
    /// Nothing within the wait (or a pipeline retired by a codec change or the end of the
    /// packets ended).
    Idle,
}

/// A video input's counts: every packet received is in exactly one of `decoding`,
/// `waiting` or `refused`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VideoCounts {
    /// Packets received.
    pub received: u64,
    /// Packets pushed into the decoder.
    pub decoding: u64,
    /// Packets dropped while the stream waited for a key frame.
    pub waiting: u64,
    /// Packets refused, by reason.
    pub refused: BTreeMap<&'static str, u64>,
    /// Frames out of the decoder (into the node's frame path).
    pub frames: u64,
    /// Gaps in FFMPEGPacket's `pts` (lost packets: the stream resynchronized at the next
    /// key frame).
    pub gaps: u64,
    /// Decoder faults (an error message, the end of the stream): resynchronized too.
    pub faults: u64,
    /// Decode pipelines started (the first key frame, a codec change, after a fault).
    pub starts: u64,
}

/// A snapshot of a video input for `/diagnostics`.
#[derive(Debug, Clone, Default)]
pub struct VideoReport {
    /// The codec and decoder of the running pipeline, and why that decoder.
    pub decoder: Option<DecoderChoice>,
    /// The last sequence parameter set's picture size.
    pub size: Option<(u32, u32)>,
    /// The counts.
    pub counts: VideoCounts,
    /// The last refusal or fault.
    pub last_problem: Option<String>,
    /// Waiting for a key frame now.
    pub waiting: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(decoder: &'static str, tail: &str) -> DecoderChoice {
        DecoderChoice {
            codec: Codec::H264,
            parser: "h264parse",
            decoder,
            tail: tail.to_string(),
            why: "video_decoder auto".to_string(),
        }
    }

    #[test]
    fn only_nvidias_decoders_are_left_in_cuda_memory() {
        let nv = choice("nvh264dec", "nvh264dec ! video/x-raw,format=NV12").in_cuda_memory();
        assert!(nv.description().ends_with("! h264parse ! nvh264dec"), "{}", nv.description());
        assert!(nv.why.contains("CUDA memory"), "{}", nv.why);
        let cpu_tail = "avdec_h264 output-corrupt=false ! videoconvert ! video/x-raw,format=NV12";
        let cpu = choice("avdec_h264", cpu_tail).in_cuda_memory();
        assert_eq!((cpu.tail.as_str(), cpu.why.as_str()), (cpu_tail, "video_decoder auto"));
        let jetson = "nvv4l2decoder ! nvvidconv ! video/x-raw,format=NV12";
        assert_eq!(choice("nvv4l2decoder", jetson).in_cuda_memory().tail, jetson);
    }
}
