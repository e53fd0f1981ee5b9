//! A fault by its cause, with the fix that fits it: a parse error by its kind (a missing
//! element named with its Debian package, [`PACKAGES`]); an error message by its cause (caps
//! that cannot be negotiated; a source that cannot open what it reads, with advice that
//! fits the kind of source ([`SOURCE_KINDS`]): a server's address, a file's path, a device;
//! any other element's error).

use gstreamer as gst;
use gstreamer::glib::translate::IntoGlib;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

use super::accepted_list;
use crate::error::CaptureError;

/// What a source element opens, for the advice of a fault that says it cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceKind {
    /// A server, at the address its properties name: is it up, can it be reached?
    Network,
    /// A file, at the path its `location` names: does it exist, can it be read?
    File,
}

/// The source elements that open a server's address or a file, with the properties that
/// name it (joined by `:`, as `host` and `port`). Any other element (`v4l2src`, a vendor's
/// camera source) is taken for a device: [`CaptureError::NoDevice`]'s advice.
const SOURCE_KINDS: &[(&str, SourceKind, &[&str])] = &[
    ("rtspsrc", SourceKind::Network, &["location"]),
    ("souphttpsrc", SourceKind::Network, &["location"]),
    ("curlhttpsrc", SourceKind::Network, &["location"]),
    ("rtmpsrc", SourceKind::Network, &["location"]),
    ("rtmp2src", SourceKind::Network, &["location"]),
    ("udpsrc", SourceKind::Network, &["uri"]),
    ("rtpsrc", SourceKind::Network, &["uri"]),
    ("srtsrc", SourceKind::Network, &["uri"]),
    ("srtclientsrc", SourceKind::Network, &["uri"]),
    ("srtserversrc", SourceKind::Network, &["uri"]),
    ("tcpclientsrc", SourceKind::Network, &["host", "port"]),
    ("tcpserversrc", SourceKind::Network, &["host", "port"]),
    ("ristsrc", SourceKind::Network, &["address", "port"]),
    ("filesrc", SourceKind::File, &["location"]),
    ("multifilesrc", SourceKind::File, &["location"]),
    ("splitfilesrc", SourceKind::File, &["location"]),
    ("imagesequencesrc", SourceKind::File, &["location"]),
];

/// An error message, named by its cause.
pub(super) fn error_fault(err: &gst::message::Error, sink: &gst_app::AppSink) -> CaptureError {
    let element = err.src().map(|s| s.name().to_string()).unwrap_or_else(|| "?".into());
    let error = err.error();
    let debug = err.debug().map(|d| d.to_string()).unwrap_or_default();
    let message = if debug.is_empty() { error.to_string() } else { format!("{error} ({debug})") };
    let flow = err.details().and_then(|d| d.get::<i32>("flow-return").ok());
    let not_negotiated = flow == Some(gst::FlowReturn::NotNegotiated.into_glib())
        || debug.contains("not-negotiated");
    if not_negotiated {
        return CaptureError::NotNegotiated {
            element,
            offered: offered(sink),
            accepted: accepted_list(),
        };
    }
    use gst::ResourceError as R;
    let kind = error.kind::<R>();
    let cannot_open = matches!(kind, Some(R::NotFound | R::OpenRead | R::OpenReadWrite | R::Busy));
    // A server or file that fails while it is read is the same fault as one that cannot be
    // opened (a device's read error is not: the device was opened).
    let cannot_read = cannot_open || kind == Some(R::Read);
    let source = err.src().and_then(|s| s.downcast_ref::<gst::Element>()).and_then(source_kind);
    match source {
        Some(Opened { kind: SourceKind::Network, target, alone }) if cannot_read => {
            CaptureError::Unreachable { element, address: target, alone, message }
        }
        Some(Opened { kind: SourceKind::File, target, .. }) if cannot_read => {
            CaptureError::NoFile { element, path: target, message }
        }
        _ if cannot_open => CaptureError::NoDevice { element, message },
        _ => CaptureError::Element { element, message },
    }
}

/// What a network or file source opens, as its properties name it.
struct Opened {
    kind: SourceKind,
    /// The address, URI or path (`host:port` where two properties name it).
    target: String,
    /// The source alone in a `gst-launch-1.0` line, to try it without the node:
    /// `gst-launch-1.0 rtspsrc location=rtsp://... ! fakesink`.
    alone: String,
}

/// A network or file source's kind ([`SOURCE_KINDS`]) and what it opens; `None` for any
/// other element.
fn source_kind(element: &gst::Element) -> Option<Opened> {
    let factory = element.factory()?;
    let &(source, kind, properties) = SOURCE_KINDS.iter().find(|s| s.0 == factory.name())?;
    let values: Option<Vec<String>> = properties
        .iter()
        .map(|&name| {
            element.find_property(name)?;
            let value = element.property_value(name).transform::<String>().ok()?;
            value.get::<Option<String>>().ok().flatten().filter(|v| !v.is_empty())
        })
        .collect();
    let Some(values) = values else {
        let target = format!("(`{}` not set)", properties.join("`, `"));
        return Some(Opened { kind, target, alone: format!("gst-launch-1.0 {source} ! fakesink") });
    };
    let set: Vec<String> =
        properties.iter().zip(&values).map(|(p, v)| format!("{p}={}", shell_word(v))).collect();
    let alone = format!("gst-launch-1.0 {source} {} ! fakesink", set.join(" "));
    Some(Opened { kind, target: values.join(":"), alone })
}

/// `value` as one word of a shell line: as it is when it holds only characters a shell
/// leaves alone, else in single quotes.
fn shell_word(value: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/:.,_-+=@%".contains(c);
    if value.chars().all(plain) {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// What the description's last element can output (its caps), for the message of a
/// failed negotiation.
pub(super) fn offered(sink: &gst_app::AppSink) -> String {
    match offered_caps(sink) {
        Some(c) if !c.is_empty() => c.to_string(),
        _ => "no format we know".into(),
    }
}

/// The caps of the element linked to our appsink.
pub(super) fn offered_caps(sink: &gst_app::AppSink) -> Option<gst::Caps> {
    sink.static_pad("sink").and_then(|pad| pad.peer()).map(|peer| peer.query_caps(None))
}

/// A parse error by its kind, the missing elements named with their Debian package.
pub(super) fn parse_fault(e: &gst::glib::Error, context: &gst::ParseContext) -> CaptureError {
    let message = e.message().to_string();
    match e.kind::<gst::ParseError>() {
        Some(gst::ParseError::NoSuchElement) => {
            let element = context.missing_elements().into_iter().next().unwrap_or_else(|| {
                // "no element \"x\"": the name between the quotes.
                message.split('"').nth(1).unwrap_or(&message).to_string()
            });
            let package = debian_package(&element).to_string();
            CaptureError::NoSuchElement { element, package }
        }
        Some(gst::ParseError::NoSuchProperty | gst::ParseError::CouldNotSetProperty) => {
            CaptureError::Property { message }
        }
        // Caps that insist on CUDA memory, to an appsink given no CUDA context: a
        // negotiation fault (with its fix), found when the description is linked.
        Some(gst::ParseError::Link | gst::ParseError::DelayedLink)
            if message.contains(super::CUDA_MEMORY_FEATURE) =>
        {
            let element = message.split_whitespace().nth(3).unwrap_or("?").to_string();
            let offered = message.split("handle caps ").nth(1).unwrap_or(&message).to_string();
            CaptureError::NotNegotiated { element, offered, accepted: accepted_list() }
        }
        Some(gst::ParseError::Link | gst::ParseError::DelayedLink) => {
            CaptureError::Link { message }
        }
        _ => CaptureError::Syntax { message },
    }
}

/// The Debian 12 package of each GStreamer element that a message of a missing one names
/// (and JetPack's, for NVIDIA's elements); any other is "one of" the plugin sets.
const PACKAGES: &[(&str, &[&str])] = &[
    (
        "gstreamer1.0-plugins-base",
        &[
            "videotestsrc",
            "videoconvert",
            "videoscale",
            "videorate",
            "appsrc",
            "appsink",
            "playbin",
            "uridecodebin",
            "decodebin",
            "tcpclientsrc",
            "oggdemux",
            "theoradec",
        ],
    ),
    (
        "gstreamer1.0-plugins-good",
        &[
            "v4l2src",
            "pngdec",
            "jpegdec",
            "multifilesrc",
            "rtspsrc",
            "rtpjpegdepay",
            "rtph264depay",
            "udpsrc",
            "souphttpsrc",
            "qtdemux",
            "matroskademux",
            "avimux",
            "videocrop",
            "videoflip",
            "imagefreeze",
        ],
    ),
    (
        "gstreamer1.0-plugins-bad",
        &[
            "rgb2bayer",
            "bayer2rgb",
            "h264parse",
            "h265parse",
            "vp9parse",
            "av1parse",
            "av1dec",
            "srtsrc",
            "webrtcbin",
            "nvh264dec",
            "nvh265dec",
            "nvvp9dec",
            "nvav1dec",
            "kmssink",
        ],
    ),
    ("gstreamer1.0-plugins-ugly", &["x264enc", "mpeg2dec"]),
    ("gstreamer1.0-libav", &["avdec_h264", "avdec_h265", "avdec_vp9", "avdec_mjpeg"]),
    (
        "JetPack's nvidia-l4t-gstreamer",
        &["nvarguscamerasrc", "nvvidconv", "nvv4l2decoder", "nvjpegdec"],
    ),
];

/// The Debian 12 package of a GStreamer element, for the message of a missing one.
pub(super) fn debian_package(element: &str) -> &'static str {
    PACKAGES
        .iter()
        .find(|(_, elements)| elements.contains(&element))
        .map(|(package, _)| *package)
        .unwrap_or("one of gstreamer1.0-plugins-base, -good, -bad, -ugly or gstreamer1.0-libav")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_elements_name_their_debian_package() {
        assert_eq!(debian_package("rgb2bayer"), "gstreamer1.0-plugins-bad");
        assert_eq!(debian_package("v4l2src"), "gstreamer1.0-plugins-good");
        assert!(debian_package("nosuchelement").starts_with("one of"));
    }

    #[test]
    fn a_network_source_alone_is_one_shell_word_per_property() {
        assert_eq!(shell_word("rtsp://10.0.0.2:554/live"), "rtsp://10.0.0.2:554/live");
        assert_eq!(shell_word("rtsp://cam/s?a=1&b=2"), "'rtsp://cam/s?a=1&b=2'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
