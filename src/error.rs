//! One error type for the crate, one kind per cause: configuration, image validation, an
//! operation that does not fit its frame, a misused API or broken invariant, the device
//! (CUDA), the hand-off's I/O, ROS, files and bags, a GStreamer input ([`CaptureError`]), a
//! compressed image that does not decode ([`DecodeError`]). Only a device failure starts
//! the GPU failure policy ([`Error::is_device_failure`]). (Why an image is rejected,
//! [`ImageError`], lives with the image in `image.rs`; why a compressed one does not
//! decode, [`DecodeError`], with the decoder in `compressed/`.)

pub use crate::compressed::DecodeError;
pub use crate::image::ImageError;

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in vision_preproc. Each message names the parameter or
/// field at fault and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is out of range or of the wrong shape.
    #[error("parameter `{param}`: {value} is invalid; {expected}")]
    Config {
        /// The ROS parameter name (dotted for nested ones, e.g. `conv.size`).
        param: String,
        /// The offending value, as given.
        value: String,
        /// The valid range or set, phrased as a fix.
        expected: String,
    },
    /// A numeric parameter outside its range (the range its ROS descriptor states).
    #[error("{param} must be in {range} (got {value})")]
    Range {
        /// The ROS parameter name (dotted for nested ones, e.g. `conv.size`).
        param: String,
        /// The offending value, as given.
        value: String,
        /// The valid range, e.g. `[1, 8192]` or `[1, 15] with step 2`.
        range: String,
    },
    /// A parameter given a value of another type (ROS parameters are statically typed).
    #[error("parameter {param} is of type {expected}; setting it to {got} is not allowed")]
    ParameterType {
        /// The ROS parameter name.
        param: String,
        /// Its type (`integer`, `double`, `string`, `integer array`, ...).
        expected: String,
        /// The type given.
        got: String,
    },
    /// An input image that cannot be processed (the frame is rejected, the node goes on).
    /// (The inner error is in the message, not a `source`, so error chains do not print
    /// it twice.)
    #[error("invalid image: {0}")]
    Image(ImageError),
    /// A `sensor_msgs/CompressedImage` that cannot be decoded (`compressed`): a bad frame
    /// like an invalid image (dropped, the node goes on), but its own kind: the cause is in
    /// the compressed bytes or their `format`, not in an `Image` field. (The inner error is
    /// in the message, not a `source`, as for `Image`.)
    #[error("compressed image: {0}")]
    Decode(DecodeError),
    /// A CUDA failure, with context.
    #[error("CUDA: {0}")]
    Cuda(CudaError),
    /// The CUDA backend failed while running and `gpu_failure_policy` is `exit` (the node
    /// exits with code 1 and this message).
    #[error("GPU failure, gpu_failure_policy exit: {reason}")]
    GpuFailure {
        /// The backend's error.
        reason: String,
    },
    /// The CUDA backend was asked for but this binary was built without it.
    #[error("backend `cuda`: this binary was built without the `cuda` feature; rebuild with `--features cuda` or set `backend: cpu`")]
    CudaNotCompiled,
    /// A preprocessing operation that does not fit the image it is run on, or its output
    /// buffer (a hand-built `PreprocessOp`; the pipeline always builds consistent ones).
    /// Only that: a call out of order or a broken invariant is [`Error::Misuse`].
    #[error("preprocessing operation does not match the image: {0}")]
    Operation(String),
    /// A call that breaks an API contract or an invariant of this crate (the caller's
    /// mistake or this crate's bug: finishing a set that was never submitted, submitting
    /// past the ring's depth). Never a device failure: it starts no `gpu_failure_policy`.
    #[error("{call}: {message}")]
    Misuse {
        /// The call that was misused (e.g. `finish_batch`).
        call: String,
        /// What is wrong, and the fix.
        message: String,
    },
    /// The zero-copy hand-off's protocol or set-up failed without an OS error (a consumer's
    /// view of what the node sent, a socket directory of another user); the message names
    /// the path or call. (An OS error of the hand-off is [`Error::HandoffIo`].)
    #[error("{0}")]
    Handoff(String),
    /// The zero-copy hand-off's own I/O failed (its socket and socket directory, memfds,
    /// mappings, thread, a consumer's connection): the OS's error, kept as the source.
    #[error("{context}: {source}")]
    HandoffIo {
        /// What was being done, with the path or call.
        context: String,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// A ROS operation failed, or ROS is not in this binary (`play`, `record`).
    #[error("ROS: {context}: {message}")]
    Ros {
        /// What was being done.
        context: String,
        /// ROS's error, or the fix.
        message: String,
    },
    /// Reading or writing a file.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A rosbag2 bag that cannot be read or written.
    #[error("bag {path}: {message}")]
    Bag {
        /// The bag (folder or file).
        path: String,
        /// What is wrong, and where.
        message: String,
    },
    /// A GStreamer input (an `inputs` entry `gst:<launch description>`, `capture/`) that
    /// cannot start or stopped delivering: the cause is [`CaptureError`]. Never a device
    /// failure.
    #[error("inputs `gst:{description}`: {fault}")]
    Capture {
        /// The launch description as given (the source part, without our appsink).
        description: String,
        /// What went wrong, and the fix.
        fault: CaptureError,
    },
    /// A YAML file that does not parse into the configuration.
    #[error("{context}: {message}")]
    Yaml {
        /// The file.
        context: String,
        /// serde_yaml's message (names the unknown or mistyped parameter).
        message: String,
    },
}

impl From<ImageError> for Error {
    fn from(e: ImageError) -> Self {
        Error::Image(e)
    }
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        Error::Decode(e)
    }
}

impl From<CudaError> for Error {
    fn from(e: CudaError) -> Self {
        Error::Cuda(e)
    }
}

impl Error {
    /// A configuration error naming `param`, the bad `value` and the `expected` range.
    pub fn config(
        param: impl Into<String>,
        value: impl std::fmt::Display,
        expected: impl Into<String>,
    ) -> Self {
        Error::Config { param: param.into(), value: value.to_string(), expected: expected.into() }
    }

    /// An I/O error with the action and path as context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// An OS error of the zero-copy hand-off, with what was being done.
    pub fn handoff_io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::HandoffIo { context: context.into(), source }
    }

    /// A misuse of `call` (a broken contract or invariant), with what is wrong.
    pub fn misuse(call: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Misuse { call: call.into(), message: message.into() }
    }

    /// The device (or its driver) failed: what `gpu_failure_policy` acts on (retry,
    /// fallback, exit). A misuse, an operation that does not fit its frame, an invalid
    /// image or an I/O error is never one.
    pub fn is_device_failure(&self) -> bool {
        matches!(self, Error::Cuda(c) if !matches!(c, CudaError::Unsupported { .. }))
    }
}

/// A CUDA failure with the context needed to find it: which call, which kernel, which
/// launch shape.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libcuda or libnvrtc could not be loaded, or no device is present.
    #[error("no usable GPU: {0}")]
    Unavailable(String),
    /// NVRTC rejected a kernel; `log` is the compiler's output.
    #[error("compiling kernel file `{file}` for {arch} failed:\n{log}")]
    Compile {
        /// Kernel source file (e.g. `resize_normalize.cu`).
        file: String,
        /// Target (e.g. `sm_87`).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// A kernel launch failed.
    #[error("launching `{kernel}` with grid {grid:?} block {block:?}: {message}")]
    Launch {
        /// Kernel entry point.
        kernel: String,
        /// Grid dimensions.
        grid: (u32, u32, u32),
        /// Block dimensions.
        block: (u32, u32, u32),
        /// Driver error.
        message: String,
    },
    /// An nvJPEG call failed (the CUDA backend's JPEG decoder, `backend/cuda/nvjpeg/`)
    /// for a reason other than the JPEG's data (that is [`DecodeError::Corrupt`]).
    #[error("{call}: {status}")]
    NvJpeg {
        /// The nvJPEG function and what it was doing (e.g. `nvjpegDecodeBatched (4 JPEGs)`).
        call: String,
        /// Its status, by name (`NVJPEG_STATUS_EXECUTION_FAILED`).
        status: String,
    },
    /// Any other driver call.
    #[error("{call}: {source}")]
    Driver {
        /// What was being done (e.g. "allocating 12 MB of pinned memory").
        call: String,
        /// The driver's error: cudarc's `DriverError` (downcast to read its `CUresult`),
        /// or, where the driver broke its own contract (success and a null pointer), what
        /// it did.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A capability this device or driver does not have (virtual memory management for
    /// shared device blocks, exporting memory as file descriptors): the feature is not
    /// used. Never a device failure ([`Error::is_device_failure`]).
    #[error("{feature} not supported: {why}")]
    Unsupported {
        /// The feature that needs it (e.g. "shared device blocks").
        feature: String,
        /// What the device lacks (names the CUDA attribute).
        why: String,
    },
}

impl CudaError {
    /// A failed driver call `call` and the driver's error (or a description of what the
    /// driver did wrong), kept as the typed source.
    pub fn driver(
        call: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        CudaError::Driver { call: call.into(), source: source.into() }
    }
}

/// Why a GStreamer input cannot start or stopped delivering (`capture/`); each message
/// names the element at fault where GStreamer does, and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    /// GStreamer itself could not be initialized (no plugin registry, ...).
    #[error("GStreamer cannot be initialized: {0}")]
    Init(String),
    /// The launch description does not parse (`gst::ParseError::Syntax`, `Empty`,
    /// `EmptyBin`).
    #[error("syntax error: {message}; write the source part of a gst-launch-1.0 line (elements joined by `!`), which vision_preproc ends with its own appsink")]
    Syntax {
        /// GStreamer's message.
        message: String,
    },
    /// An element of the description does not exist: its plugin is not installed
    /// (or the name is misspelt).
    #[error("no GStreamer element `{element}`: install its plugin ({package}) or correct the name; `gst-inspect-1.0 {element}` says whether it is installed")]
    NoSuchElement {
        /// The element's factory name, as written.
        element: String,
        /// The Debian package that holds it, where we know it.
        package: String,
    },
    /// A property that the element does not have or cannot take that value.
    #[error("{message}; `gst-inspect-1.0 <element>` lists its properties and their values")]
    Property {
        /// GStreamer's message (names the property and element).
        message: String,
    },
    /// Two elements of the description (or its last element and our appsink) cannot be
    /// linked.
    #[error("cannot link: {message}; the description must end in an element with one video source pad (not a sink)")]
    Link {
        /// GStreamer's message.
        message: String,
    },
    /// The description's output caps and the formats vision_preproc decodes have nothing
    /// in common.
    #[error("caps cannot be negotiated: element `{element}` offers {offered}, but vision_preproc decodes only {accepted}; end the description with `! videoconvert` (or a camera format from that list); frames in CUDA memory (`memory:CUDAMemory`, NV12) are taken only by the CUDA backend where GStreamer's CUDA library loads, else end with `! cudadownload`")]
    NotNegotiated {
        /// The element that reported it.
        element: String,
        /// What the description's last element offers (its caps), where GStreamer said.
        offered: String,
        /// The formats our appsink accepts.
        accepted: String,
    },
    /// A source's device does not exist, cannot be opened or is busy
    /// (`gst::ResourceError::NotFound`, `OpenRead`, `OpenReadWrite`, `Busy`), from a
    /// source that is not a network or file source (a camera's `v4l2src`).
    #[error("element `{element}` cannot open its device or file: {message}; check that it exists and is not in use (cameras: `v4l2-ctl --list-devices`, `ls /dev/video*`)")]
    NoDevice {
        /// The element that reported it.
        element: String,
        /// GStreamer's message (and its debug text).
        message: String,
    },
    /// A network source (`rtspsrc`, `udpsrc`, `souphttpsrc`, ...) cannot connect to its
    /// server or read from it (the resource errors of [`CaptureError::NoDevice`], and
    /// `Read`).
    #[error("element `{element}` cannot reach {address}: {message}; check that the server (a camera, a streaming server) is up and reachable from this machine (the address, port and path in the description, the network, a firewall); `{alone}` tries the source alone")]
    Unreachable {
        /// The element that reported it.
        element: String,
        /// The address or URI it connects to, from its `location`, `uri` or `host` and
        /// `port`.
        address: String,
        /// The source alone in a `gst-launch-1.0` line (`gst-launch-1.0 rtspsrc
        /// location=... ! fakesink`), to try it without the node.
        alone: String,
        /// GStreamer's message (and its debug text).
        message: String,
    },
    /// A file source (`filesrc`, `multifilesrc`, ...) cannot open or read its file (the
    /// resource errors of [`CaptureError::NoDevice`], and `Read`).
    #[error("element `{element}` cannot read the file {path}: {message}; check that it exists and is readable by this process")]
    NoFile {
        /// The element that reported it.
        element: String,
        /// The path of its `location`.
        path: String,
        /// GStreamer's message (and its debug text).
        message: String,
    },
    /// An element posted an error message (at start or while running).
    #[error("element `{element}`: {message}")]
    Element {
        /// The element that reported it.
        element: String,
        /// GStreamer's message (and its debug text).
        message: String,
    },
    /// The pipeline ended (a file, `num-buffers`, a camera that was unplugged).
    #[error("end of stream: the pipeline delivers no more frames (a file or `num-buffers` ended, or the source stopped); for a file that should repeat, use `multifilesrc loop=true`")]
    EndOfStream,
    /// A state change failed without an error message saying why.
    #[error("the pipeline cannot go to {state}: {message}")]
    State {
        /// The state asked for (`PLAYING`, `NULL`).
        state: String,
        /// GStreamer's message.
        message: String,
    },
    /// A negotiated format or buffer that an `ImageView` cannot hold (odd width of a
    /// 4:2:2 format, a buffer shorter than its caps say, a negative stride).
    #[error("unusable frame: {message}")]
    Frame {
        /// What is wrong, and the fix.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_names_its_cause_and_only_the_device_starts_the_failure_policy() {
        let misuse = Error::misuse("finish_batch", "no batch in flight: submit_batch first");
        assert_eq!(misuse.to_string(), "finish_batch: no batch in flight: submit_batch first");
        let refused = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let handoff = Error::handoff_io("binding /tmp/x.sock", refused);
        assert_eq!(handoff.to_string(), "binding /tmp/x.sock: address in use");
        let source = std::error::Error::source(&handoff).and_then(|s| s.downcast_ref());
        assert_eq!(source.map(std::io::Error::kind), Some(std::io::ErrorKind::AddrInUse));
        let ros = Error::Ros { context: "play".into(), message: "no subscriber on /image".into() };
        assert_eq!(ros.to_string(), "ROS: play: no subscriber on /image");
        let device = Error::Cuda(CudaError::driver("cuEventRecord", "CUDA_ERROR_ILLEGAL_ADDRESS"));
        assert_eq!(device.to_string(), "CUDA: cuEventRecord: CUDA_ERROR_ILLEGAL_ADDRESS");
        assert!(device.is_device_failure());
        let op = Error::Operation("set_source: encoding 3 is not the frame's 2".into());
        let capture = Error::Capture {
            description: "videotestsrc num-buffers=1".into(),
            fault: CaptureError::EndOfStream,
        };
        assert!(capture
            .to_string()
            .starts_with("inputs `gst:videotestsrc num-buffers=1`: end of stream"));
        let decode = Error::from(DecodeError::JpegPrecision { bits: 12 });
        assert!(decode.to_string().starts_with("compressed image: JPEG has 12-bit samples"));
        for e in [misuse, handoff, ros, op, capture, decode, Error::CudaNotCompiled] {
            assert!(!e.is_device_failure(), "{e:?}");
        }
    }

    #[test]
    fn a_missing_capability_is_not_a_device_failure_and_a_driver_error_keeps_its_source() {
        let missing = Error::Cuda(CudaError::Unsupported {
            feature: "shared device blocks".into(),
            why: "the device has no virtual memory management (CUDA attribute 102)".into(),
        });
        assert_eq!(
            missing.to_string(),
            "CUDA: shared device blocks not supported: the device has no virtual memory \
             management (CUDA attribute 102)"
        );
        assert!(!missing.is_device_failure());
        let driver = CudaError::driver("cuMemAllocHost", "returned success and a null pointer");
        let source = std::error::Error::source(&driver).map(|s| s.to_string());
        assert_eq!(source.as_deref(), Some("returned success and a null pointer"));
        assert!(Error::Cuda(driver).is_device_failure());
    }
}
