//! Frames from a GStreamer pipeline, without ROS: a user's launch description (the source
//! part of a `gst-launch-1.0` line) ended by our appsink, whose caps are exactly the
//! formats the kernels decode ([`ACCEPTED`]), and each buffer lent as an [`ImageView`]
//! (feature `gstreamer`).
//!
//! ```text
//! "<description> ! appsink name=vision_preproc_sink"   (caps: ACCEPTED, max-buffers 2, sync=false;
//!                                                        drop=true for a live source)
//!     CaptureSource::start(description)   parse, PLAYING, wait for the state change
//!     source.next(timeout)                Ok(Some(Frame)) | Ok(None) on timeout | Err(named fault)
//!     frame.view()                        an ImageView of the mapped buffer (or of one tight copy)
//!     source.stop() / drop                NULL: the streaming threads joined, the device closed
//! ```
//!
//! **Layout.** An `ImageView` has one `step` for every row and, for NV12/NV21, the chroma
//! plane right after `height` rows of `step` bytes. GStreamer's default layouts (what a
//! source writes when the sink does not take `GstVideoMeta`, which appsink does not) are
//! exactly that, with every row padded to a multiple of 4 bytes (`RGB` at width 321: step
//! 964, not 963; NV12 at width 322: step 324 for both planes, chroma at `324 * height`):
//! such a frame is borrowed from the mapped buffer, zero copies. A buffer whose
//! `GstVideoMeta` says otherwise (planes with different strides, a chroma plane elsewhere, a
//! buffer shorter than its rows) is copied once into tight rows, and [`Frame::copied`] says
//! so. Bayer (`video/x-bayer`) has no `GstVideoInfo`: its step is the buffer's size over
//! its height (`rgb2bayer` pads rows to 4 bytes too).
//!
//! **Capture time.** A frame's [`CaptureTime`] is its PTS as a time of the pipeline's clock
//! (running time + base time) and which clock that is ([`ClockKind`]: GStreamer's system
//! clock is `CLOCK_MONOTONIC` by default). For a live source (`v4l2src`, `is-live=true`)
//! that is when the frame was captured; for a source that is not live it is only the
//! stream's own timeline from the start (frames come as fast as they are made).
//!
//! One file per concern: the pipeline's life cycle and bus (`source.rs`), a frame and its
//! capture time (`frame.rs`), a buffer's layout against a view's (`layout.rs`), a fault
//! named by its cause with the fix that fits the element (`fault.rs`), the memory lent to
//! the backend (`lend.rs`), video packets into a decode pipeline (`video.rs`: the decoder
//! chosen per machine, the stream's key frames and gaps); here the formats our appsink
//! accepts.
//!
//! [`ImageView`]: crate::image::ImageView

mod cuda;
mod fault;
mod frame;
mod layout;
mod lend;
mod source;
mod time;
mod video;
mod video_types;

use gstreamer as gst;

use crate::image::Encoding;

pub use cuda::{cuda_status, GpuShare, CUDA_MEMORY_FEATURE};
pub use frame::Frame;
pub use source::CaptureSource;
pub use time::{CaptureTime, ClockKind};
pub use video::{
    choose_decoder, decoders_status, DecoderChoice, Outcome, Packet, Step, VideoCounts, VideoFeed,
    VideoFrames, VideoReport,
};

/// The formats our appsink accepts, in order of preference: (media type, GStreamer
/// `format`, our encoding, big-endian samples). One source for the appsink's caps, the
/// mapping of a negotiated format to an [`Encoding`] and the error messages.
pub const ACCEPTED: [(&str, &str, Encoding, bool); 17] = [
    ("video/x-raw", "BGR", Encoding::Bgr8, false),
    ("video/x-raw", "RGB", Encoding::Rgb8, false),
    // The fourth byte is ignored by the kernels: padding (x) and alpha alike.
    ("video/x-raw", "BGRx", Encoding::Bgra8, false),
    ("video/x-raw", "BGRA", Encoding::Bgra8, false),
    ("video/x-raw", "RGBx", Encoding::Rgba8, false),
    ("video/x-raw", "RGBA", Encoding::Rgba8, false),
    ("video/x-raw", "GRAY8", Encoding::Mono8, false),
    ("video/x-raw", "GRAY16_LE", Encoding::Mono16, false),
    ("video/x-raw", "GRAY16_BE", Encoding::Mono16, true),
    ("video/x-raw", "YUY2", Encoding::Yuyv, false),
    ("video/x-raw", "UYVY", Encoding::Uyvy, false),
    ("video/x-raw", "NV12", Encoding::Nv12, false),
    ("video/x-raw", "NV21", Encoding::Nv21, false),
    ("video/x-bayer", "rggb", Encoding::BayerRggb8, false),
    ("video/x-bayer", "bggr", Encoding::BayerBggr8, false),
    ("video/x-bayer", "gbrg", Encoding::BayerGbrg8, false),
    ("video/x-bayer", "grbg", Encoding::BayerGrbg8, false),
];

/// The formats our appsink also accepts in GStreamer's CUDA memory (`memory:CUDAMemory`),
/// preferred over all of [`ACCEPTED`], when the source shares a GPU backend's CUDA context
/// ([`GpuShare`]): what the nvcodec decoders give for 8-bit 4:2:0 streams. Read in place on
/// the device ([`Frame::device`]). (Their 10-bit and 4:4:4 outputs, P010 and Y444, are
/// not decoded by the kernels: not accepted, GStreamer says so by name.)
pub const ACCEPTED_CUDA: [&str; 1] = ["NV12"];

/// The accepted formats as the error messages list them: `video/x-raw` BGR, RGB, ...;
/// `video/x-bayer` rggb, ...
pub fn accepted_list() -> String {
    let list = |media: &str| {
        ACCEPTED.iter().filter(|a| a.0 == media).map(|a| a.1).collect::<Vec<_>>().join(", ")
    };
    format!("video/x-raw {}; video/x-bayer {} (8-bit)", list("video/x-raw"), list("video/x-bayer"))
}

/// End GStreamer's idle streaming threads (a stopped pipeline's threads go back to
/// GStreamer's task pool and wait there, still named after their element): called once
/// every pipeline of the node is stopped (the managed node's cleanup), so that a node
/// without pipelines holds no GStreamer thread. `gst_task_cleanup_all` joins the pool's
/// threads and prepares a new pool. Its threads then wait in GLib's shared pool
/// (`pool-<program>`): those already waiting are stopped, and one that arrives a moment
/// later (a race with the stop) leaves after GLib's idle time, lowered from 15 s to 1 s.
pub fn release_idle_threads() {
    /// How long GLib keeps an idle shared pool thread, in ms.
    const IDLE_THREAD_MS: u32 = 1000;
    gst::Task::cleanup_all();
    gst::glib::ThreadPool::set_max_idle_time(IDLE_THREAD_MS);
    gst::glib::ThreadPool::stop_unused_threads();
}

/// What `vision_preproc info` says of GStreamer: its version and whether `gst:` inputs
/// can run here (GStreamer initializes, our appsink's plugin is installed), or why not.
pub fn status() -> String {
    if let Err(e) = gst::init() {
        return format!("cannot be initialized ({e}): `gst:` inputs cannot run");
    }
    let (major, minor, micro, _) = gst::version();
    let version = format!("{major}.{minor}.{micro}");
    match gst::ElementFactory::find("appsink") {
        Some(_) => format!(
            "{version}: `gst:` inputs run in the node; their frames are read in place from \
             GStreamer's buffers (the CUDA backend's GPU reads a buffer of system memory where \
             it is, registered with the driver: no host copy; any other after one host copy \
             into its pinned staging)"
        ),
        None => format!(
            "{version}, but no appsink (install gstreamer1.0-plugins-base): `gst:` inputs \
             cannot run"
        ),
    }
}

/// The appsink's caps: every entry of [`ACCEPTED`], in system memory; first, when `cuda`
/// (the source shares the backend's CUDA context), [`ACCEPTED_CUDA`] in CUDA memory.
fn accepted_caps(cuda: bool) -> gst::Caps {
    let mut caps = gst::Caps::new_empty();
    if cuda {
        let s = gst::Structure::builder("video/x-raw")
            .field("format", gst::List::new(ACCEPTED_CUDA))
            .build();
        let features = gst::CapsFeatures::new([CUDA_MEMORY_FEATURE]);
        caps.make_mut().append_structure_full(s, Some(features));
    }
    for media in ["video/x-raw", "video/x-bayer"] {
        let formats = ACCEPTED.iter().filter(|a| a.0 == media).map(|a| a.1);
        let s = gst::Structure::builder(media).field("format", gst::List::new(formats)).build();
        caps.make_mut().append_structure(s);
    }
    caps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_formats_map_to_distinct_caps_and_cover_the_8_bit_encodings_but_16_bit_rgb() {
        let mut seen = std::collections::HashSet::new();
        for (media, format, _, _) in ACCEPTED {
            assert!(seen.insert((media, format)), "{media} {format} twice");
        }
        for e in Encoding::ALL {
            let covered = ACCEPTED.iter().any(|a| a.2 == e);
            // GStreamer has no 16-bit RGB format of 3 samples (its RGB16 is 5-6-5).
            assert_eq!(covered, !matches!(e, Encoding::Rgb16 | Encoding::Bgr16), "{e}");
        }
        assert_eq!(
            accepted_list(),
            "video/x-raw BGR, RGB, BGRx, BGRA, RGBx, RGBA, GRAY8, GRAY16_LE, GRAY16_BE, YUY2, UYVY, NV12, NV21; video/x-bayer rggb, bggr, gbrg, grbg (8-bit)"
        );
    }

    #[test]
    fn cuda_memory_is_accepted_only_when_the_context_is_shared() {
        gst::init().unwrap();
        let decoded: gst::Caps =
            "video/x-raw(memory:CUDAMemory), format=NV12, width=1920, height=1080".parse().unwrap();
        let p010: gst::Caps =
            "video/x-raw(memory:CUDAMemory), format=P010_10LE, width=64, height=64"
                .parse()
                .unwrap();
        let system: gst::Caps = "video/x-raw, format=NV12, width=64, height=64".parse().unwrap();
        let (shared, alone) = (accepted_caps(true), accepted_caps(false));
        assert!(decoded.can_intersect(&shared));
        assert!(!decoded.can_intersect(&alone), "CUDA memory without a shared context");
        assert!(!p010.can_intersect(&shared), "10-bit is not decoded by the kernels");
        assert!(system.can_intersect(&shared) && system.can_intersect(&alone));
        // CUDA memory first: a decoder that can give both gives CUDA memory.
        let first = shared.features(0).expect("features");
        assert!(first.contains(CUDA_MEMORY_FEATURE), "{shared}");
        assert_eq!(shared.size(), alone.size() + 1);
    }
}
