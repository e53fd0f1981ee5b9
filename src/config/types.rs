//! The parameters' value types: the enums a parameter takes a name from, and the
//! `conv.*` group.

use serde::{Deserialize, Serialize};

/// How the source is resampled to the network size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u32)]
pub enum Interpolation {
    /// Nearest neighbour, `cv2.INTER_NEAREST` (`src = floor(dst * src_size / dst_size)`).
    Nearest = 0,
    /// Bilinear, `cv2.INTER_LINEAR` (half-pixel centres, edge clamp, no antialiasing).
    Linear = 1,
}

/// How the aspect ratio of the source is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResizeMode {
    /// Scale each axis independently to the network size (aspect ratio not kept).
    Stretch,
    /// Keep the aspect ratio, fit inside, pad the rest with `pad_value`.
    Letterbox,
    /// Keep the aspect ratio, fill the network image, crop the excess evenly.
    CenterCrop,
}

/// Where a letterboxed image sits in the network image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LetterboxAnchor {
    /// Centred; odd padding puts the extra pixel on the right/bottom.
    Center,
    /// In the top-left corner; all padding on the right/bottom.
    TopLeft,
}

/// Channel order of the output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelOrder {
    /// Channel 0 is red.
    Rgb,
    /// Channel 0 is blue.
    Bgr,
}

/// Memory layout of the output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u32)]
pub enum Layout {
    /// Planar: `[1, C, H, W]`.
    #[serde(rename = "NCHW")]
    Nchw = 0,
    /// Interleaved: `[1, H, W, C]`.
    #[serde(rename = "NHWC")]
    Nhwc = 1,
}

impl Layout {
    /// The name used in parameters and in `Tensor.layout`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "NCHW",
            Layout::Nhwc => "NHWC",
        }
    }
}

/// Element type of the output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u32)]
pub enum DType {
    /// IEEE 754 single precision.
    Float32 = 0,
    /// IEEE 754 half precision (round to nearest even).
    Float16 = 1,
}

impl DType {
    /// The name used in parameters and in `Tensor.dtype`.
    pub fn name(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::Float16 => "float16",
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Float32 => 4,
            DType::Float16 => 2,
        }
    }
    /// Its DLPack type code (`DLDataTypeCode`: 0 int, 1 uint, 2 float), written into a
    /// `TensorRef` with bits = 8 x [`DType::size`].
    pub(crate) fn dlpack_code(self) -> u8 {
        match self {
            DType::Float32 | DType::Float16 => 2, // kDLFloat
        }
    }
}

/// The convolution applied to each channel after normalization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvKernel {
    /// No convolution.
    None,
    /// Normalized box filter (mean of `size` x `size`).
    Box,
    /// Gaussian, `cv2.getGaussianKernel(size, sigma)` in both axes.
    Gaussian,
    /// Unsharp mask: `2 * identity - gaussian(size, sigma)`.
    Sharpen,
    /// Sobel derivative along x, `cv2.getDerivKernels(1, 0, size)`.
    SobelX,
    /// Sobel derivative along y, `cv2.getDerivKernels(0, 1, size)`.
    SobelY,
    /// Laplacian, as `cv2.Laplacian(ksize=size)` builds it.
    Laplacian,
    /// `conv.weights`, `size` x `size`, row-major.
    Custom,
}

/// How conv2d reads outside the network image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u32)]
pub enum Border {
    /// `aaaaaa|abcdefgh|hhhhhhh` (`cv2.BORDER_REPLICATE`).
    Replicate = 0,
    /// Zeros outside (`cv2.BORDER_CONSTANT`, value 0 in normalized units).
    Constant = 1,
    /// `fedcb|abcdefgh|gfedcb` (`cv2.BORDER_REFLECT_101`, OpenCV's default).
    Reflect101 = 2,
}

/// Which backend processes frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// CUDA when a usable GPU exists, else the CPU (with a warning).
    Auto,
    /// CUDA, or fail at start-up.
    Cuda,
    /// The CPU backend.
    Cpu,
}

/// How frames reach the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryMode {
    /// `mapped` on integrated GPUs (Jetson), `upload` on discrete ones.
    Auto,
    /// Copy from pinned host memory to device memory on the stream.
    Upload,
    /// The kernel reads pinned, device-mapped host memory directly (zero-copy).
    Mapped,
}

/// What the node does when the CUDA backend fails while running (a CUDA error from a
/// frame: a kernel fault, a lost device, an allocation failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuFailurePolicy {
    /// Switch to the CPU backend for good; the failed frame is run again on the CPU.
    Fallback,
    /// Rebuild the CUDA backend (new context, kernels from the disk cache) and run the
    /// failed frame again; after `pipeline::GPU_RETRY_ATTEMPTS` failed rebuilds, fall back
    /// to the CPU.
    Retry,
    /// Stop the node with a non-zero exit code and the reason (for a supervisor that
    /// restarts it).
    Exit,
}

/// A QoS choice, by the names Isaac ROS uses, plus `auto` for the input. (Not
/// `QosPreset`: that is r2r's type, which the node builds from this.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QosPreset {
    /// Input only: what the image publishers offer, by `ros2 bag record`'s rule
    /// (reliable only if every publisher is reliable, transient-local only if every one
    /// is), chosen again as publishers come and go (`transport::adapt_to_offers`).
    Auto,
    /// Best effort, keep last (`rclcpp::SensorDataQoS`): matches every publisher.
    SensorData,
    /// Reliable, keep last, volatile (`rclcpp::QoS(depth)`).
    Default,
    /// Whatever the RMW's defaults are.
    SystemDefault,
}

/// How the frames of several cameras are grouped into one batch (`batch_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchPolicyChoice {
    /// The newest frame of every camera, once each live camera has a new one or
    /// `batch_timeout_ms` after the first new one.
    Latest,
    /// message_filters' ApproximateTime rule over header stamps, with `max_interval_ms`.
    ApproximateTime,
}

impl BatchPolicyChoice {
    /// The parameter value.
    pub fn name(self) -> &'static str {
        match self {
            BatchPolicyChoice::Latest => "latest",
            BatchPolicyChoice::ApproximateTime => "approximate_time",
        }
    }
}

/// How an image topic's frames travel: image_transport's transport (`image_transport`,
/// `input_transports`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// `sensor_msgs/Image` on the topic itself.
    Raw,
    /// `sensor_msgs/CompressedImage` (JPEG, PNG) on `<topic>/compressed`, decoded where the
    /// kernels run (docs/COMPRESSED.md); H.264/H.265 ones (`format` `h264`, `h265`: Isaac
    /// ROS's encoder) go to the input's video decoder (docs/VIDEO.md).
    Compressed,
    /// `foxglove_msgs/CompressedVideo` on `<topic>/foxglove` (foxglove_compressed_video_transport),
    /// decoded by the input's video decoder (docs/VIDEO.md).
    Foxglove,
    /// `ffmpeg_image_transport_msgs/FFMPEGPacket` on `<topic>/ffmpeg` (ffmpeg_image_transport),
    /// decoded by the input's video decoder (docs/VIDEO.md).
    Ffmpeg,
}

impl Transport {
    /// The parameter value.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Raw => "raw",
            Transport::Compressed => "compressed",
            Transport::Foxglove => "foxglove",
            Transport::Ffmpeg => "ffmpeg",
        }
    }

    /// True for the transports that carry video packets only (`foxglove`, `ffmpeg`);
    /// `compressed` carries them beside JPEG and PNG.
    pub fn is_video(self) -> bool {
        matches!(self, Transport::Foxglove | Transport::Ffmpeg)
    }

    /// A parameter value.
    pub(crate) fn parse(s: &str) -> Option<Transport> {
        match s {
            "raw" => Some(Transport::Raw),
            "compressed" => Some(Transport::Compressed),
            "foxglove" => Some(Transport::Foxglove),
            "ffmpeg" => Some(Transport::Ffmpeg),
            _ => None,
        }
    }
}

/// Which decoders a video input may use (`video_decoder`; docs/VIDEO.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VideoDecoder {
    /// NVIDIA's (GStreamer's `nvcodec`: nvh264dec, ...) where they are registered, else the
    /// CPU's. Never the Jetson's: that one is asked for by name.
    Auto,
    /// The CPU's: gstreamer1.0-libav's `avdec_*` (AV1: `av1dec`).
    Cpu,
    /// NVIDIA's `nvcodec` decoders (NVDEC), refused where they are not registered.
    Nvidia,
    /// The Jetson's `nvv4l2decoder` (JetPack), its frames brought to system memory by
    /// `nvvidconv`. Written from NVIDIA's documentation, not run here.
    Jetson,
}

impl VideoDecoder {
    /// The parameter value.
    pub fn name(self) -> &'static str {
        match self {
            VideoDecoder::Auto => "auto",
            VideoDecoder::Cpu => "cpu",
            VideoDecoder::Nvidia => "nvidia",
            VideoDecoder::Jetson => "jetson",
        }
    }
}

/// Which DDS participant takes each input's images (`input_participants`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputParticipants {
    /// The node's own participant takes every input (one Fast DDS receive thread).
    One,
    /// Each input its own participant (a hidden node `_<node>_input<i>`), with its own
    /// receive thread and its own thread taking the images.
    PerInput,
}

impl InputParticipants {
    /// The parameter value.
    pub fn name(self) -> &'static str {
        match self {
            InputParticipants::One => "one",
            InputParticipants::PerInput => "per_input",
        }
    }
}

/// The conv2d parameters (`conv.*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConvConfig {
    /// Filter: none | box | gaussian | sharpen | sobel_x | sobel_y | laplacian | custom.
    pub kernel: ConvKernel,
    /// Kernel size, odd, 1..=15. sobel and laplacian take 1 as OpenCV's `ksize=1` does
    /// (a 3-tap derivative without smoothing; the kernel applied is 3x3).
    pub size: u32,
    /// Gaussian sigma in network pixels (gaussian, sharpen); <= 0 derives it from `size`
    /// as OpenCV does: `0.3 * ((size - 1) * 0.5 - 1) + 0.8`.
    pub sigma: f64,
    /// `size * size` weights, row-major, for `custom` (correlation, like cv2.filter2D).
    pub weights: Vec<f64>,
    /// Border: replicate | constant | reflect101.
    pub border: Border,
}

impl Default for ConvConfig {
    fn default() -> Self {
        ConvConfig {
            kernel: ConvKernel::None,
            size: 3,
            sigma: 0.0,
            weights: Vec::new(),
            border: Border::Replicate,
        }
    }
}
