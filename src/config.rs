//! The configuration: one struct, the single source of truth for every ROS parameter,
//! the YAML files in `config/`, and the defaults.
//!
//! YAML files use the ROS shape, so the same file works with `ros2 launch` and here:
//!
//! ```yaml
//! vision_preproc:
//!   ros__parameters:
//!     network_image_width: 640
//!     conv:
//!       kernel: gaussian
//! ```

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

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
    /// kernels run (docs/COMPRESSED.md).
    Compressed,
}

impl Transport {
    /// The parameter value.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Raw => "raw",
            Transport::Compressed => "compressed",
        }
    }

    /// A parameter value.
    fn parse(s: &str) -> Option<Transport> {
        match s {
            "raw" => Some(Transport::Raw),
            "compressed" => Some(Transport::Compressed),
            _ => None,
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

/// Every parameter of the node. Field names are the ROS parameter names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Width of the network input in pixels, 1..=8192.
    pub network_image_width: u32,
    /// Height of the network input in pixels, 1..=8192.
    pub network_image_height: u32,
    /// Region of the source to use, `[x, y, width, height]` in source pixels, applied
    /// before everything else; `[]` for the whole image.
    pub roi: Vec<i64>,
    /// Resampling: linear | nearest.
    pub interpolation: Interpolation,
    /// Aspect handling: stretch | letterbox | center_crop.
    pub resize_mode: ResizeMode,
    /// Letterbox padding colour in SOURCE 8-bit pixel units `[R, G, B]` (or one value for
    /// all channels), so the padding is normalized like real pixels. 0..=255.
    pub pad_value: Vec<f64>,
    /// Letterbox placement: center | top_left.
    pub letterbox_anchor: LetterboxAnchor,
    /// Factor from 8-bit pixel units to the units of `image_mean`/`image_stddev`
    /// (default 1/255). 16-bit sources are first divided by 257, so 65535 -> 255.
    pub pixel_scale: f64,
    /// Per-channel mean subtracted after scaling, in OUTPUT channel order (1 or
    /// `output_channels` values).
    pub image_mean: Vec<f64>,
    /// Per-channel standard deviation divided by, in OUTPUT channel order (1 or
    /// `output_channels` values, each non-zero).
    pub image_stddev: Vec<f64>,
    /// Output channel order: rgb | bgr (ignored for 1-channel output).
    pub channel_order: ChannelOrder,
    /// Output channels: 3 (colour; grey sources are replicated) or 1 (grey; colour sources
    /// are converted with OpenCV's RGB2GRAY weights).
    pub output_channels: u32,
    /// Output layout: NCHW | NHWC.
    pub output_layout: Layout,
    /// Output element type: float32 | float16.
    pub output_dtype: DType,
    /// conv2d after normalization.
    pub conv: ConvConfig,
    /// `Tensor.name` of the published tensor.
    pub tensor_name: String,
    /// Backend: auto | cuda | cpu.
    pub backend: BackendChoice,
    /// CUDA device ordinal.
    pub device_id: u32,
    /// How frames reach the GPU: auto | upload | mapped.
    pub memory_mode: MemoryMode,
    /// When the CUDA backend fails while running: fallback | retry | exit.
    pub gpu_failure_policy: GpuFailurePolicy,
    /// QoS of the `image` and `camera_info` subscriptions: auto | sensor_data | default
    /// | system_default.
    pub input_qos: QosPreset,
    /// History depth of the input subscriptions, 1..=100. The node processes only the
    /// newest frame whatever the depth; the depth is room in the DDS reader for frames
    /// still arriving: a reliable subscription to large (fragmented) frames needs it for
    /// the frames being repaired (1080p at 30 Hz from an rclpy camera: 47 of 360 frames
    /// with depth 1, 360 of 360 with 10).
    pub input_qos_depth: u32,
    /// QoS of the published topics: sensor_data | default | system_default.
    pub output_qos: QosPreset,
    /// History depth of the publishers, 1..=100.
    pub output_qos_depth: u32,
    /// Highest rate of `debug_image` in Hz (only computed while subscribed); 0 disables it.
    pub debug_image_rate: f64,
    /// The inputs, at most 16, no duplicates: each an image topic (a relative name, e.g.
    /// `front/image`) or `gst:<launch description>`, a GStreamer pipeline inside the node
    /// (docs/CAMERAS.md); `[]` = the single input topic `image`; 2 or more = one
    /// `TensorBatch` of N items on `tensor`, item i from `inputs[i]`. One topic behaves
    /// exactly like `[]` on that topic.
    pub inputs: Vec<String>,
    /// Per input, the `header.frame_id` of a pipeline input's frames (`[]`, or one entry
    /// per input: `""` = `camera` for one input, `camera_<i>` for input i of several; a
    /// topic input's entry must be `""`: its frames carry their own).
    pub input_frame_ids: Vec<String>,
    /// Per input, a pipeline input's calibration (`file:///path.yaml`, the YAML of ROS
    /// camera drivers and `camera_calibration`; `""` = none); `[]`, or one entry per
    /// input (a topic input's entry must be `""`).
    pub camera_info_urls: Vec<String>,
    /// The transport of the image topics: `raw` (`sensor_msgs/Image`) or `compressed`
    /// (`sensor_msgs/CompressedImage` on `<topic>/compressed`), as image_transport's
    /// subscribers take it.
    pub image_transport: Transport,
    /// Per input, its transport where it differs from `image_transport` (`[]`, or one
    /// entry per input: `""` = `image_transport`, `raw`, `compressed`; a `gst:` input's
    /// entry must be `""`).
    pub input_transports: Vec<String>,
    /// How a batch is formed (2+ inputs): latest | approximate_time.
    pub batch_policy: BatchPolicyChoice,
    /// `latest`: longest wait in ms after the first new frame before a batch is published
    /// without the cameras that have no new frame (they repeat their last), [1, 10000].
    pub batch_timeout_ms: u32,
    /// `approximate_time`: largest spread in ms of the header stamps within a batch,
    /// [0, 10000].
    pub max_interval_ms: u32,
    /// A camera without a frame for this long (ms) is stale: batches stop waiting for it and
    /// its slot is padded and flagged invalid until its next frame, [1, 600000].
    pub stale_after_ms: u32,
    /// `approximate_time`: frames kept per camera while looking for a set, [1, 100].
    pub batch_queue_size: u32,
    /// Which DDS participant takes the input images: one | per_input
    /// (docs/MULTI_CAMERA.md, *Highest frame rates*).
    pub input_participants: InputParticipants,
    /// Shared output blocks for `tensor_ref` (docs/HANDOFF.md), [0, 64]; 0: no
    /// `tensor_ref`.
    pub shared_pool_size: u32,
    /// A consumer holding a shared block longer than this (ms) is disconnected and its
    /// blocks taken back, [10, 600000].
    pub shared_lease_ms: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            network_image_width: 640,
            network_image_height: 480,
            roi: Vec::new(),
            interpolation: Interpolation::Linear,
            resize_mode: ResizeMode::Letterbox,
            pad_value: vec![0.0, 0.0, 0.0],
            letterbox_anchor: LetterboxAnchor::Center,
            pixel_scale: 1.0 / 255.0,
            image_mean: vec![0.5, 0.5, 0.5],
            image_stddev: vec![0.5, 0.5, 0.5],
            channel_order: ChannelOrder::Rgb,
            output_channels: 3,
            output_layout: Layout::Nchw,
            output_dtype: DType::Float32,
            conv: ConvConfig::default(),
            tensor_name: "input".to_string(),
            backend: BackendChoice::Auto,
            device_id: 0,
            memory_mode: MemoryMode::Auto,
            gpu_failure_policy: GpuFailurePolicy::Retry,
            input_qos: QosPreset::Auto,
            input_qos_depth: 10,
            output_qos: QosPreset::Default,
            output_qos_depth: 1,
            debug_image_rate: 2.0,
            inputs: Vec::new(),
            input_frame_ids: Vec::new(),
            camera_info_urls: Vec::new(),
            image_transport: Transport::Raw,
            input_transports: Vec::new(),
            batch_policy: BatchPolicyChoice::Latest,
            batch_timeout_ms: 50,
            max_interval_ms: 20,
            stale_after_ms: 1000,
            batch_queue_size: 5,
            input_participants: InputParticipants::One,
            shared_pool_size: 4,
            shared_lease_ms: 2000,
        }
    }
}

/// Largest network width or height accepted.
pub const MAX_NETWORK_SIZE: u32 = 8192;
/// Largest conv2d kernel size.
pub(crate) const MAX_CONV_SIZE: u32 = 15;

/// An inclusive integer range with a step from `from`, as a ROS `IntegerRange` states it
/// (`ros2 param describe` shows it; rqt_reconfigure makes a slider of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IntRange {
    /// Smallest valid value.
    pub from: i64,
    /// Largest valid value.
    pub to: i64,
    /// Valid values are `from + k * step` (1: every integer).
    pub step: u64,
}

impl IntRange {
    /// Whether `v` is in the range and on a step.
    pub(crate) fn contains(&self, v: i64) -> bool {
        v >= self.from
            && v <= self.to
            && (self.step <= 1 || (v - self.from).unsigned_abs().is_multiple_of(self.step))
    }

    /// `Ok` if `v` is in the range, else the error naming `param` and the range.
    pub(crate) fn check(&self, param: &str, v: i64) -> Result<()> {
        if self.contains(v) {
            Ok(())
        } else {
            Err(Error::Range {
                param: param.to_string(),
                value: v.to_string(),
                range: self.to_string(),
            })
        }
    }
}

impl std::fmt::Display for IntRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}, {}]", self.from, self.to)?;
        if self.step > 1 {
            write!(f, " with step {}", self.step)?;
        }
        Ok(())
    }
}

/// An inclusive floating-point range, as a ROS `FloatingPointRange` states it (step 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FloatRange {
    /// Smallest valid value.
    pub from: f64,
    /// Largest valid value.
    pub to: f64,
}

impl FloatRange {
    /// Whether `v` is in the range (NaN is not).
    pub(crate) fn contains(&self, v: f64) -> bool {
        (self.from..=self.to).contains(&v)
    }
}

impl std::fmt::Display for FloatRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}, {}]", self.from, self.to)
    }
}

/// `network_image_width` and `network_image_height`, in pixels.
pub(crate) const NETWORK_SIZE_RANGE: IntRange =
    IntRange { from: 1, to: MAX_NETWORK_SIZE as i64, step: 1 };
/// `conv.size`: odd sizes 1, 3, ..., 15.
pub(crate) const CONV_SIZE_RANGE: IntRange =
    IntRange { from: 1, to: MAX_CONV_SIZE as i64, step: 2 };
/// `output_channels`: 1 (grey) or 3 (colour).
pub(crate) const OUTPUT_CHANNELS_RANGE: IntRange = IntRange { from: 1, to: 3, step: 2 };
/// `input_qos_depth` and `output_qos_depth`.
pub(crate) const QOS_DEPTH_RANGE: IntRange = IntRange { from: 1, to: 100, step: 1 };
/// Most cameras in one batch (`inputs`).
pub(crate) const MAX_INPUTS: usize = 16;

/// The prefix of an entry of `inputs` that is a GStreamer pipeline.
pub(crate) const PIPELINE_PREFIX: &str = "gst:";

/// Where an input's frames come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InputSource {
    /// A `sensor_msgs/Image` topic (relative name).
    Topic(String),
    /// A GStreamer launch description (after `gst:`), run inside the node.
    Pipeline(String),
}
/// `batch_timeout_ms`.
pub(crate) const BATCH_TIMEOUT_RANGE: IntRange = IntRange { from: 1, to: 10_000, step: 1 };
/// `max_interval_ms`.
pub(crate) const MAX_INTERVAL_RANGE: IntRange = IntRange { from: 0, to: 10_000, step: 1 };
/// `stale_after_ms`.
pub(crate) const STALE_AFTER_RANGE: IntRange = IntRange { from: 1, to: 600_000, step: 1 };
/// `batch_queue_size`.
pub(crate) const BATCH_QUEUE_RANGE: IntRange = IntRange { from: 1, to: 100, step: 1 };
/// `shared_pool_size`.
pub(crate) const SHARED_POOL_RANGE: IntRange = IntRange { from: 0, to: 64, step: 1 };
/// `shared_lease_ms`.
pub(crate) const SHARED_LEASE_RANGE: IntRange = IntRange { from: 10, to: 600_000, step: 1 };
/// Each value of `pad_value`, in source 8-bit pixel units.
pub(crate) const PAD_VALUE_RANGE: FloatRange = FloatRange { from: 0.0, to: 255.0 };

/// A ROS topic name as rcl accepts it (relative, absolute or `~`-private): tokens of
/// letters, digits and `_` separated by single `/`, none starting with a digit, no
/// trailing `/`.
pub(crate) fn valid_topic_name(t: &str) -> bool {
    let body = t.strip_prefix("~/").or_else(|| t.strip_prefix('/')).unwrap_or(t);
    !body.is_empty()
        && body.split('/').all(|tok| {
            !tok.is_empty()
                && !tok.starts_with(|c: char| c.is_ascii_digit())
                && tok.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// Parameters every ROS node may be given that are not vision_preproc's own: accepted in
/// parameter files (a shared `/**:` section has them) without a warning. `use_sim_time`
/// is handled by the node itself (its clock); offline it has no meaning.
pub(crate) fn is_ros_standard_parameter(name: &str) -> bool {
    name == "use_sim_time"
        || name == "start_type_description_service"
        || name.starts_with("qos_overrides.")
}

/// A parameter given to vision_preproc that it does not have. rclcpp and rclpy nodes
/// ignore parameters they did not declare, and robot stacks share one parameters file
/// (`/**:` sections) between many nodes, so this is a warning, never an error: the value
/// is ignored, and the warning names the closest parameter there is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownParameter {
    /// The name as given (dotted for nested ones).
    pub name: String,
    /// The closest parameter name of vision_preproc, when one is close.
    pub suggestion: Option<String>,
    /// Where it was given (the file, `--set`, `parameters`).
    pub source: String,
}

impl std::fmt::Display for UnknownParameter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` is not a parameter of vision_preproc (ignored)", self.name)?;
        if let Some(s) = &self.suggestion {
            write!(f, "; did you mean `{s}`?")?;
        }
        Ok(())
    }
}

/// Every parameter name of vision_preproc, dotted for nested ones (`conv.kernel`), in the
/// order of [`Config`]'s fields.
pub(crate) fn parameter_names() -> Vec<String> {
    fn walk(v: &serde_yaml::Value, prefix: &str, out: &mut Vec<String>) {
        if let Some(map) = v.as_mapping() {
            for (k, v) in map {
                let k = format!("{prefix}{}", k.as_str().unwrap_or(""));
                if v.is_mapping() {
                    walk(v, &format!("{k}."), out);
                } else {
                    out.push(k);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&config_doc(&Config::default()), "", &mut out);
    out
}

/// The parameter name closest to `name`, if one is close: a known name that `name` ends
/// with (`vision_preproc.backend`), else the most similar by Jaro-Winkler similarity (which
/// favours a shared beginning: `network_width` -> `network_image_width`, `backnd` ->
/// `backend`) when it is at least [`SUGGESTION_SIMILARITY`].
pub(crate) fn closest_parameter(name: &str, names: &[String]) -> Option<String> {
    if let Some(n) = names.iter().find(|n| name.ends_with(&format!(".{n}"))) {
        return Some(n.clone());
    }
    names
        .iter()
        .map(|n| (strsim::jaro_winkler(name, n), n))
        .filter(|(sim, _)| *sim >= SUGGESTION_SIMILARITY)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, n)| n.clone())
}

/// Least similarity for "did you mean".
const SUGGESTION_SIMILARITY: f64 = 0.85;

/// A configuration with the parameters that were ignored because vision_preproc does not
/// have them (warn about each).
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The validated configuration.
    pub config: Config,
    /// Unknown parameters, in the order given.
    pub unknown: Vec<UnknownParameter>,
}

fn config_doc(cfg: &Config) -> serde_yaml::Value {
    // Serializing a plain struct of numbers, strings and vectors cannot fail.
    serde_yaml::to_value(cfg).unwrap_or(serde_yaml::Value::Null)
}

impl Config {
    /// Parse a YAML file in the ROS `<node>: ros__parameters: {...}` shape, or a bare
    /// mapping of parameters, strictly: an unknown parameter is an error (the tests of the
    /// files this project ships; the CLI uses [`Config::load_yaml_file`], which warns
    /// instead, as the node does). Validated.
    #[cfg(test)]
    pub(crate) fn from_yaml_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        Self::from_yaml_str(&text, &path.display().to_string())
    }

    /// A YAML text read strictly (an unknown parameter is an error); `context` names the
    /// source in errors. Validated.
    pub fn from_yaml_str(text: &str, context: &str) -> Result<Config> {
        Self::from_yaml_str_with_overrides(text, context, &[])
    }

    /// [`Config::from_yaml_str`], then `overrides` applied in order before validation:
    /// each is `(dotted key, YAML value)`, e.g. `("conv.kernel", "box")` or
    /// `("roi", "[0, 0, 64, 48]")` (the command line's `--set key=value`). Strict: an
    /// unknown parameter is an error naming it and the closest known one.
    pub fn from_yaml_str_with_overrides(
        text: &str,
        context: &str,
        overrides: &[(String, String)],
    ) -> Result<Config> {
        let loaded = Self::load_yaml_str(text, context, overrides)?;
        match loaded.unknown.first() {
            Some(u) => Err(Error::Yaml { context: u.source.clone(), message: u.to_string() }),
            None => Ok(loaded.config),
        }
    }

    /// Load a parameters file the way the node reads it, then `overrides` (see
    /// [`Config::from_yaml_str_with_overrides`]).
    ///
    /// The file is a ROS parameters file: sections `<node name>: ros__parameters: {...}`;
    /// the sections for this node are merged in file order: `/**`, `**`, `vision_preproc`
    /// and `/vision_preproc` (as r2r matches them), or, when no section has one of those
    /// names and there is exactly one section, that one (a file written for a renamed
    /// node). A bare mapping of parameters is read as one section. Inside a section,
    /// parameters may be nested (`conv: {kernel: box}`), written flat with dotted names
    /// (`conv.kernel: box`, which rcl's parser reads the same way) or both. Parameters
    /// vision_preproc does not have are ignored and returned in [`Loaded::unknown`];
    /// ROS-wide ones (`use_sim_time`, `qos_overrides.*`) are ignored silently.
    pub fn load_yaml_str(
        text: &str,
        context: &str,
        overrides: &[(String, String)],
    ) -> Result<Loaded> {
        let yaml_err = |e: serde_yaml::Error| Error::Yaml {
            context: context.to_string(),
            message: e.to_string(),
        };
        let doc: serde_yaml::Value = serde_yaml::from_str(text).map_err(yaml_err)?;
        let mut params = Vec::new();
        for section in node_sections(&doc, context)? {
            flatten_params(section, "", &mut params);
        }
        let from_file: Vec<String> = params.iter().map(|p| p.0.clone()).collect();
        for (key, value) in overrides {
            let parsed: serde_yaml::Value = serde_yaml::from_str(value).map_err(|e| {
                Error::config(key, format!("{value:?}"), format!("give a YAML value ({e})"))
            })?;
            check_name(key)?;
            params.push((key.clone(), parsed));
        }
        let mut loaded = Self::from_params(params, context)?;
        for u in &mut loaded.unknown {
            if !from_file.contains(&u.name) {
                u.source = "--set".to_string();
            }
        }
        Ok(loaded)
    }

    /// [`Config::load_yaml_str`] on a file.
    pub fn load_yaml_file(path: &Path, overrides: &[(String, String)]) -> Result<Loaded> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        Self::load_yaml_str(&text, &path.display().to_string(), overrides)
    }

    /// The defaults overlaid with `params` (dotted name, value; later ones win), checked:
    /// what the node does with its ROS parameters and the offline tools with a file.
    /// Unknown names are returned, not applied.
    pub(crate) fn from_params(
        params: impl IntoIterator<Item = (String, serde_yaml::Value)>,
        context: &str,
    ) -> Result<Loaded> {
        let names = parameter_names();
        let mut doc = config_doc(&Config::default());
        let mut unknown: Vec<UnknownParameter> = Vec::new();
        for (name, value) in params {
            if names.contains(&name) {
                set_value(&mut doc, &name, value)?;
            } else if !is_ros_standard_parameter(&name) && !unknown.iter().any(|u| u.name == name) {
                let suggestion = closest_parameter(&name, &names);
                unknown.push(UnknownParameter { name, suggestion, source: context.to_string() });
            }
        }
        let config = Self::from_yaml_value(doc, context)?;
        Ok(Loaded { config, unknown })
    }

    /// Deserialize and validate a mapping of parameters; errors name the parameter path
    /// (e.g. `conv.kernel: unknown variant ...`).
    pub(crate) fn from_yaml_value(params: serde_yaml::Value, context: &str) -> Result<Config> {
        let cfg: Config = serde_path_to_error::deserialize(params).map_err(|e| Error::Yaml {
            context: context.to_string(),
            message: if e.path().to_string() == "." {
                e.inner().to_string()
            } else {
                format!("parameter `{}`: {}", e.path(), e.inner())
            },
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Check every value; the error names the parameter, the value and the valid range.
    pub fn validate(&self) -> Result<()> {
        for (param, v) in [
            ("network_image_width", self.network_image_width),
            ("network_image_height", self.network_image_height),
        ] {
            NETWORK_SIZE_RANGE.check(param, i64::from(v))?;
        }
        if !self.roi.is_empty() {
            if self.roi.len() != 4 {
                return Err(Error::config(
                    "roi",
                    format!("{:?}", self.roi),
                    "give [x, y, width, height] or [] for the whole image",
                ));
            }
            if self.roi[0] < 0 || self.roi[1] < 0 || self.roi[2] < 1 || self.roi[3] < 1 {
                return Err(Error::config(
                    "roi",
                    format!("{:?}", self.roi),
                    "x and y must be >= 0, width and height >= 1",
                ));
            }
            if self.roi.iter().any(|&v| v > i64::from(u32::MAX)) {
                return Err(Error::config(
                    "roi",
                    format!("{:?}", self.roi),
                    "values must fit in 32 bits",
                ));
            }
        }
        check_per_channel("pad_value", &self.pad_value, 3)?;
        if self.pad_value.iter().any(|v| !PAD_VALUE_RANGE.contains(*v)) {
            return Err(Error::Range {
                param: "pad_value".to_string(),
                value: format!("{:?}", self.pad_value),
                range: format!("{PAD_VALUE_RANGE} for each value (source 8-bit pixel units)"),
            });
        }
        if !self.pixel_scale.is_finite() || self.pixel_scale == 0.0 {
            return Err(Error::config(
                "pixel_scale",
                self.pixel_scale,
                "use a finite, non-zero factor (e.g. 0.00392156862745098 = 1/255)",
            ));
        }
        OUTPUT_CHANNELS_RANGE.check("output_channels", i64::from(self.output_channels))?;
        let c = self.output_channels as usize;
        check_per_channel("image_mean", &self.image_mean, c)?;
        check_per_channel("image_stddev", &self.image_stddev, c)?;
        if self.image_mean.iter().any(|v| !v.is_finite()) {
            return Err(Error::config(
                "image_mean",
                format!("{:?}", self.image_mean),
                "values must be finite",
            ));
        }
        if self.image_stddev.iter().any(|v| !v.is_finite() || *v == 0.0) {
            return Err(Error::config(
                "image_stddev",
                format!("{:?}", self.image_stddev),
                "values must be finite and non-zero",
            ));
        }
        self.validate_conv()?;
        if self.tensor_name.is_empty() {
            return Err(Error::config(
                "tensor_name",
                "\"\"",
                "give the network input's name, e.g. \"input\"",
            ));
        }
        if self.output_qos == QosPreset::Auto {
            return Err(Error::config(
                "output_qos",
                "auto",
                "auto adapts a subscription to its publishers and applies to input_qos only; \
                 use sensor_data, default or system_default",
            ));
        }
        for (param, v) in
            [("input_qos_depth", self.input_qos_depth), ("output_qos_depth", self.output_qos_depth)]
        {
            QOS_DEPTH_RANGE.check(param, i64::from(v))?;
        }
        SHARED_POOL_RANGE.check("shared_pool_size", i64::from(self.shared_pool_size))?;
        SHARED_LEASE_RANGE.check("shared_lease_ms", i64::from(self.shared_lease_ms))?;
        if !self.debug_image_rate.is_finite() || self.debug_image_rate < 0.0 {
            return Err(Error::config(
                "debug_image_rate",
                self.debug_image_rate,
                "use a rate in Hz >= 0 (0 disables debug_image)",
            ));
        }
        self.validate_batch()
    }

    /// The `inputs` and batching checks of [`Config::validate`].
    fn validate_batch(&self) -> Result<()> {
        if self.inputs.len() > MAX_INPUTS {
            return Err(Error::config(
                "inputs",
                format!("{} topics", self.inputs.len()),
                format!("list at most {MAX_INPUTS} image topics"),
            ));
        }
        for (i, t) in self.inputs.iter().enumerate() {
            if let Some(description) = t.strip_prefix(PIPELINE_PREFIX) {
                if description.trim().is_empty() {
                    return Err(Error::config(
                        "inputs",
                        format!("{t:?} (item {i})"),
                        "give the source part of a gst-launch-1.0 line after `gst:` (e.g. \
                         gst:v4l2src device=/dev/video0 ! video/x-raw,format=YUY2)",
                    ));
                }
                if !cfg!(feature = "gstreamer") {
                    return Err(Error::config(
                        "inputs",
                        format!("{t:?} (item {i})"),
                        "this build has no GStreamer: build with the cargo feature \
                         `gstreamer` (a default one), or subscribe to a topic",
                    ));
                }
            } else if !valid_topic_name(t) {
                return Err(Error::config(
                    "inputs",
                    format!("{t:?} (item {i})"),
                    "give ROS topic names: letters, digits, `_`, `/` and `~`, no empty \
                     token, a token not starting with a digit (e.g. front/image), or a \
                     GStreamer pipeline as gst:<description>",
                ));
            }
            if self.inputs[..i].contains(t) {
                return Err(Error::config(
                    "inputs",
                    format!(
                        "{t:?} (items {} and {i})",
                        self.inputs[..i].iter().position(|x| x == t).unwrap_or(0)
                    ),
                    "list each topic once (batch index = position in inputs)",
                ));
            }
        }
        BATCH_TIMEOUT_RANGE.check("batch_timeout_ms", i64::from(self.batch_timeout_ms))?;
        MAX_INTERVAL_RANGE.check("max_interval_ms", i64::from(self.max_interval_ms))?;
        STALE_AFTER_RANGE.check("stale_after_ms", i64::from(self.stale_after_ms))?;
        BATCH_QUEUE_RANGE.check("batch_queue_size", i64::from(self.batch_queue_size))?;
        self.validate_per_input()
    }

    /// `input_frame_ids` and `camera_info_urls`: empty, or one entry per input, set only for
    /// pipeline inputs; each URL a `file://` one.
    fn validate_per_input(&self) -> Result<()> {
        let sources = self.input_sources();
        for (i, t) in self.input_transports.iter().enumerate() {
            if !t.is_empty() && Transport::parse(t).is_none() {
                return Err(Error::config(
                    "input_transports",
                    format!("{t:?} (item {i})"),
                    "give \"\" (image_transport's), \"raw\" or \"compressed\"",
                ));
            }
        }
        for (name, list, topic_entry) in [
            ("input_frame_ids", &self.input_frame_ids, true),
            ("camera_info_urls", &self.camera_info_urls, true),
            ("input_transports", &self.input_transports, false),
        ] {
            if !list.is_empty() && list.len() != sources.len() {
                return Err(Error::config(
                    name,
                    format!("{} entries for {} inputs", list.len(), sources.len()),
                    "give [] or one entry per entry of inputs (\"\" where none applies)",
                ));
            }
            for (i, (v, source)) in list.iter().zip(&sources).enumerate() {
                let topic = matches!(source, InputSource::Topic(_));
                if v.is_empty() || topic != topic_entry {
                    continue;
                }
                let why = if topic {
                    format!(
                        "input {i} is a topic, whose messages carry their own header and \
                         camera_info: give \"\" for it"
                    )
                } else {
                    format!(
                        "input {i} is a gst: pipeline, which has no transport: give \"\" for it"
                    )
                };
                return Err(Error::config(name, format!("{v:?} (item {i})"), why));
            }
        }
        for (i, url) in self.camera_info_urls.iter().enumerate() {
            if !url.is_empty() && !url.starts_with("file://") {
                return Err(Error::config(
                    "camera_info_urls",
                    format!("{url:?} (item {i})"),
                    "give a file:// URL of a camera calibration YAML (e.g. \
                     file:///home/me/.ros/camera_info/front.yaml)",
                ));
            }
        }
        if self.input_frame_ids.iter().any(|f| f.chars().any(char::is_whitespace)) {
            return Err(Error::config(
                "input_frame_ids",
                format!("{:?}", self.input_frame_ids),
                "give TF frame names without spaces",
            ));
        }
        Ok(())
    }

    /// Where each input's frames come from: `inputs`, or the topic `image` when empty.
    pub(crate) fn input_sources(&self) -> Vec<InputSource> {
        if self.inputs.is_empty() {
            return vec![InputSource::Topic("image".to_string())];
        }
        self.inputs
            .iter()
            .map(|t| match t.strip_prefix(PIPELINE_PREFIX) {
                Some(d) => InputSource::Pipeline(d.trim().to_string()),
                None => InputSource::Topic(t.clone()),
            })
            .collect()
    }

    /// The transport of topic input `index`: its `input_transports` entry, or
    /// `image_transport`.
    pub fn input_transport(&self, index: usize) -> Transport {
        self.input_transports
            .get(index)
            .and_then(|t| Transport::parse(t))
            .unwrap_or(self.image_transport)
    }

    /// How many topic inputs take compressed frames (`image_transport`,
    /// `input_transports`): the most compressed frames a set can have.
    pub(crate) fn compressed_inputs(&self) -> usize {
        self.input_sources()
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                matches!(s, InputSource::Topic(_))
                    && self.input_transport(*i) == Transport::Compressed
            })
            .count()
    }

    /// How many inputs the node has (1 with `inputs: []`).
    pub(crate) fn input_count(&self) -> usize {
        self.inputs.len().max(1)
    }

    /// The `header.frame_id` of pipeline input `index`'s frames: its `input_frame_ids` entry, or
    /// `camera` (one input) / `camera_<index>`.
    #[cfg_attr(not(feature = "gstreamer"), allow(dead_code))]
    pub(crate) fn pipeline_frame_id(&self, index: usize) -> String {
        match self.input_frame_ids.get(index).filter(|f| !f.is_empty()) {
            Some(f) => f.clone(),
            None => self.pipeline_camera_name(index),
        }
    }

    /// The name of pipeline input `index` as a camera: `camera` with one input,
    /// `camera_<index>` with several (its topics are `<name>/image_raw` and
    /// `<name>/camera_info`).
    #[cfg_attr(not(feature = "gstreamer"), allow(dead_code))]
    pub(crate) fn pipeline_camera_name(&self, index: usize) -> String {
        if self.is_batch() {
            format!("camera_{index}")
        } else {
            "camera".to_string()
        }
    }

    /// True when the node publishes `TensorBatch` (2 or more inputs).
    pub fn is_batch(&self) -> bool {
        self.inputs.len() >= 2
    }

    /// Bytes of the tensor data of one published set: network width x height x output
    /// channels x the dtype's size, times the inputs of a batch. The one source of the
    /// output's size: the pipeline's (`Pipeline::output_bytes`, the `tensor_ref` blocks)
    /// and the node's Fast DDS segment (`transport::dds::largest_output`).
    pub fn tensor_bytes(&self) -> usize {
        let pixels = self.network_image_width as usize * self.network_image_height as usize;
        let items = if self.is_batch() { self.inputs.len() } else { 1 };
        pixels * self.output_channels as usize * self.output_dtype.size() * items
    }

    /// The `conv.*` checks of [`Config::validate`]. Each value is checked whatever the
    /// kernel (so a value that is never valid is refused when it is set, not later when
    /// another parameter changes); only the weight count depends on another parameter.
    pub(crate) fn validate_conv(&self) -> Result<()> {
        let conv = &self.conv;
        let s = conv.size;
        CONV_SIZE_RANGE.check("conv.size", i64::from(s))?;
        // Applied in float32: a finite f64 beyond f32::MAX would become inf.
        if let Some((i, w)) =
            conv.weights.iter().enumerate().find(|(_, w)| !(**w as f32).is_finite())
        {
            return Err(Error::config(
                "conv.weights",
                format!("{w} at index {i}"),
                "weights must be finite and within float32 range (|w| <= 3.4e38)",
            ));
        }
        if !conv.sigma.is_finite() {
            return Err(Error::config(
                "conv.sigma",
                conv.sigma,
                "use a finite sigma; <= 0 derives it from conv.size",
            ));
        }
        if conv.kernel == ConvKernel::Custom {
            let n = (s * s) as usize;
            if conv.weights.len() != n {
                return Err(Error::config(
                    "conv.weights",
                    format!("{} values", conv.weights.len()),
                    format!(
                        "conv.kernel custom with conv.size {s} needs conv.size*conv.size = {n} \
                         values, row-major (set conv.size and conv.weights together)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The value of `values` for output channel `c` (one value means all channels).
    pub(crate) fn per_channel(values: &[f64], c: usize) -> f64 {
        if values.len() == 1 {
            values[0]
        } else {
            values[c]
        }
    }
}

fn check_per_channel(param: &str, values: &[f64], channels: usize) -> Result<()> {
    if values.len() == 1 || values.len() == channels {
        Ok(())
    } else {
        Err(Error::config(
            param,
            format!("{values:?}"),
            format!("give 1 value or {channels} (one per output channel)"),
        ))
    }
}

/// Set the dotted parameter `key` (e.g. `conv.kernel`) of a parameter mapping to the
/// YAML value `value` (typed as YAML types it: `3`, `0.5`, `[1, 2]`, `box`), creating
/// nested groups as needed. Whether the key exists is checked when the mapping is
/// deserialized (unknown keys are rejected there, by name).
pub fn set_param(params: &mut serde_yaml::Value, key: &str, value: &str) -> Result<()> {
    let parsed: serde_yaml::Value = serde_yaml::from_str(value).map_err(|e| {
        Error::config(key, format!("{value:?}"), format!("give a YAML value ({e})"))
    })?;
    set_value(params, key, parsed)
}

/// An error unless `key` is a well-formed dotted parameter name.
fn check_name(key: &str) -> Result<()> {
    if key.split('.').any(|p| p.is_empty()) {
        return Err(Error::config(
            "--set",
            format!("{key:?}"),
            "give a parameter name, dotted for nested ones (e.g. conv.kernel)",
        ));
    }
    Ok(())
}

/// Set the dotted parameter `key` of a parameter mapping to an already typed `value`
/// (see [`set_param`]).
pub(crate) fn set_value(
    params: &mut serde_yaml::Value,
    key: &str,
    parsed: serde_yaml::Value,
) -> Result<()> {
    use serde_yaml::Value;
    check_name(key)?;
    let parts: Vec<&str> = key.split('.').collect();
    let mut node = params;
    for (i, part) in parts.iter().enumerate() {
        let Value::Mapping(map) = node else {
            return Err(Error::config(
                parts[..i].join("."),
                format!("{key:?}"),
                format!("`{}` is a value, not a group of parameters", parts[..i].join(".")),
            ));
        };
        let k = Value::String((*part).to_string());
        if i + 1 == parts.len() {
            map.insert(k, parsed);
            return Ok(());
        }
        node = map.entry(k).or_insert_with(|| Value::Mapping(serde_yaml::Mapping::new()));
    }
    Ok(())
}

/// The node names whose sections apply to vision_preproc, as r2r matches them.
const OUR_SECTIONS: [&str; 4] = ["/**", "**", "vision_preproc", "/vision_preproc"];

/// The parameter mappings of `doc` that apply to vision_preproc (see
/// [`Config::load_yaml_str`]), in file order.
fn node_sections<'a>(
    doc: &'a serde_yaml::Value,
    context: &str,
) -> Result<Vec<&'a serde_yaml::Value>> {
    use serde_yaml::Value;
    let Some(map) = doc.as_mapping() else {
        return Ok(Vec::new()); // empty file (null)
    };
    let sections: Vec<(String, &Value)> = map
        .iter()
        .filter_map(|(k, v)| {
            let params = v.as_mapping()?.get("ros__parameters")?;
            Some((k.as_str().unwrap_or("").to_string(), params))
        })
        .collect();
    if sections.is_empty() {
        return Ok(vec![doc]); // a bare mapping of parameters
    }
    let ours: Vec<&Value> =
        sections.iter().filter(|(n, _)| OUR_SECTIONS.contains(&n.as_str())).map(|s| s.1).collect();
    match (ours.is_empty(), sections.len()) {
        (false, _) => Ok(ours),
        (true, 1) => Ok(vec![sections[0].1]),
        (true, _) => Err(Error::Yaml {
            context: context.to_string(),
            message: format!(
                "none of the sections {:?} is for vision_preproc; name one `vision_preproc:` \
                 or `/**:` (sections for other nodes are ignored)",
                sections.iter().map(|s| s.0.as_str()).collect::<Vec<_>>()
            ),
        }),
    }
}

/// `(dotted name, value)` of every parameter in a section, nested groups and dotted
/// names alike (`conv: {kernel: box}` and `conv.kernel: box` both give `conv.kernel`).
fn flatten_params(v: &serde_yaml::Value, prefix: &str, out: &mut Vec<(String, serde_yaml::Value)>) {
    let Some(map) = v.as_mapping() else {
        return;
    };
    for (k, v) in map {
        let key = match k {
            serde_yaml::Value::String(s) => s.clone(),
            other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
        };
        let name = format!("{prefix}{key}");
        if v.is_mapping() {
            flatten_params(v, &format!("{name}."), out);
        } else {
            out.push((name, v.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn shipped_default_yaml_equals_code_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.yaml");
        assert_eq!(Config::from_yaml_file(&path).unwrap(), Config::default());
    }

    #[test]
    fn ros_shape_and_bare_mapping_both_parse() {
        let a = Config::from_yaml_str(
            "my_node:\n  ros__parameters:\n    network_image_width: 320\n    conv:\n      kernel: box\n",
            "test",
        )
        .unwrap();
        assert_eq!(a.network_image_width, 320);
        assert_eq!(a.conv.kernel, ConvKernel::Box);
        let b =
            Config::from_yaml_str("network_image_width: 320\nconv: {kernel: box}\n", "t").unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn unknown_parameter_is_named() {
        let e = Config::from_yaml_str("n:\n  ros__parameters:\n    network_width: 3\n", "f.yaml")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "f.yaml: `network_width` is not a parameter of vision_preproc (ignored); did you \
             mean `network_image_width`?"
        );
    }

    #[test]
    fn suggestions_are_close_names_only() {
        let names = parameter_names();
        let s = |n: &str| closest_parameter(n, &names);
        assert_eq!(s("network_width").as_deref(), Some("network_image_width"));
        assert_eq!(s("network_image_widht").as_deref(), Some("network_image_width"));
        assert_eq!(s("backnd").as_deref(), Some("backend"));
        assert_eq!(s("conv.kernal").as_deref(), Some("conv.kernel"));
        assert_eq!(s("conv.kernl").as_deref(), Some("conv.kernel"));
        assert_eq!(s("vision_preproc.backend").as_deref(), Some("backend"));
        assert_eq!(s("input_qos_dept").as_deref(), Some("input_qos_depth"));
        for far in ["robot_frame", "frame_rate", "exposure", "camera_name", "use_sim"] {
            assert_eq!(s(far), None, "{far}");
        }
    }

    /// The node reads flat dotted names, nested groups and a mix the same way (rcl's
    /// parser does); so does the offline loader.
    #[test]
    fn flat_dotted_nested_and_mixed_files_mean_the_same() {
        let nested = "vision_preproc:\n  ros__parameters:\n    conv:\n      kernel: gaussian\n      size: 5\n    network_image_width: 320\n";
        let flat = "vision_preproc:\n  ros__parameters:\n    conv.kernel: gaussian\n    conv.size: 5\n    network_image_width: 320\n";
        let mixed = "vision_preproc:\n  ros__parameters:\n    conv.kernel: gaussian\n    conv:\n      size: 5\n    network_image_width: 320\n";
        let a = Config::from_yaml_str(nested, "nested").unwrap();
        assert_eq!(
            (a.conv.kernel, a.conv.size, a.network_image_width),
            (ConvKernel::Gaussian, 5, 320)
        );
        assert_eq!(Config::from_yaml_str(flat, "flat").unwrap(), a);
        assert_eq!(Config::from_yaml_str(mixed, "mixed").unwrap(), a);
        // A flat name for a field that is not a group is unknown, by its full name.
        let e = Config::from_yaml_str("tensor_name.x: a\n", "f").unwrap_err().to_string();
        assert!(e.contains("`tensor_name.x` is not a parameter"), "{e}");
    }

    /// A parameters file shared by a robot stack: `/**` for every node, a section for
    /// another node, one for ours. Ours and `/**` apply (in file order); the other node's
    /// section does not; unknown keys in the sections that apply are reported, not fatal;
    /// ROS-wide ones (use_sim_time) are accepted silently.
    #[test]
    fn shared_parameter_files_warn_about_unknown_keys() {
        let text = "/**:\n  ros__parameters:\n    use_sim_time: true\n    frame_rate: 30\n    network_image_height: 200\n\
                    camera_driver:\n  ros__parameters:\n    network_image_width: 7\n    exposure: 3\n\
                    vision_preproc:\n  ros__parameters:\n    network_image_width: 320\n    backnd: cpu\n    qos_overrides./tensor.publisher.depth: 3\n";
        let loaded = Config::load_yaml_str(text, "shared.yaml", &[]).unwrap();
        assert_eq!(
            (loaded.config.network_image_width, loaded.config.network_image_height),
            (320, 200)
        );
        let unknown: Vec<String> = loaded.unknown.iter().map(|u| u.to_string()).collect();
        assert_eq!(
            unknown,
            [
                "`frame_rate` is not a parameter of vision_preproc (ignored)",
                "`backnd` is not a parameter of vision_preproc (ignored); did you mean `backend`?",
            ]
        );
        // Known values stay strictly validated.
        let bad = text.replace("network_image_width: 320", "network_image_width: 0");
        let e = Config::load_yaml_str(&bad, "shared.yaml", &[]).unwrap_err().to_string();
        assert_eq!(e, "network_image_width must be in [1, 8192] (got 0)");
        // --set follows the same rules.
        let loaded =
            Config::load_yaml_str("", "defaults", &[("conv.kernal".into(), "box".into())]).unwrap();
        assert_eq!(loaded.unknown[0].suggestion.as_deref(), Some("conv.kernel"));
        // Only other nodes' sections: an error that says which sections apply.
        let e = Config::load_yaml_str(
            "a:\n  ros__parameters: {x: 1}\nb:\n  ros__parameters: {y: 1}\n",
            "t",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("none of the sections [\"a\", \"b\"] is for vision_preproc"), "{e}");
    }

    #[test]
    fn errors_name_parameter_value_and_range() {
        let mut c = Config { network_image_width: 0, ..Config::default() };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "network_image_width must be in [1, 8192] (got 0)"
        );
        c = Config::default();
        c.conv.size = 4;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "conv.size must be in [1, 15] with step 2 (got 4)"
        );
        c = Config { image_stddev: vec![0.5, 0.0, 0.5], ..Config::default() };
        assert!(c.validate().unwrap_err().to_string().starts_with("parameter `image_stddev`"));
        c = Config { roi: vec![1, 2, 3], ..Config::default() };
        assert!(c.validate().unwrap_err().to_string().contains("[x, y, width, height]"));
    }

    #[test]
    fn inputs_are_checked_and_name_the_topic() {
        let with = |inputs: &[&str]| Config {
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            ..Config::default()
        };
        for ok in [&["a/image", "/b/image_raw", "~/c"][..], &["image"], &[]] {
            with(ok).validate().unwrap();
        }
        let e = with(&["a/image", "a/image"]).validate().unwrap_err().to_string();
        assert!(e.contains("inputs") && e.contains("items 0 and 1") && e.contains("once"), "{e}");
        for bad in ["", "a//b", "a/", "1cam/image", "a b"] {
            let e = with(&["x", bad]).validate().unwrap_err().to_string();
            assert!(e.contains("inputs") && e.contains("item 1"), "{bad:?}: {e}");
        }
        let many: Vec<String> = (0..17).map(|i| format!("c{i}/image")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(with(&refs).validate().unwrap_err().to_string().contains("at most 16"));
        assert_eq!(with(&[]).input_sources(), vec![InputSource::Topic("image".into())]);
        assert_eq!(
            with(&["a", "gst: videotestsrc ! video/x-raw,format=BGR"]).input_sources(),
            vec![
                InputSource::Topic("a".into()),
                InputSource::Pipeline("videotestsrc ! video/x-raw,format=BGR".into())
            ]
        );
        let e = with(&["gst:  "]).validate().unwrap_err().to_string();
        assert!(e.contains("inputs") && e.contains("gst-launch-1.0"), "{e}");
        assert!(!with(&["a"]).is_batch() && with(&["a", "b"]).is_batch());
        let c = Config { batch_timeout_ms: 0, ..Config::default() };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "batch_timeout_ms must be in [1, 10000] (got 0)"
        );
    }

    #[test]
    #[cfg_attr(
        not(feature = "gstreamer"),
        ignore = "a `gst:` input is valid only with the feature gstreamer"
    )]
    fn per_input_frame_ids_and_calibrations_name_the_entry() {
        let gst = "gst:videotestsrc ! video/x-raw,format=BGR";
        let c = |ids: &[&str], urls: &[&str]| Config {
            inputs: vec!["front/image".into(), gst.into()],
            input_frame_ids: ids.iter().map(|s| s.to_string()).collect(),
            camera_info_urls: urls.iter().map(|s| s.to_string()).collect(),
            ..Config::default()
        };
        c(&[], &[]).validate().unwrap();
        let ok = c(&["", "rear_optical"], &["", "file:///tmp/rear.yaml"]);
        ok.validate().unwrap();
        assert_eq!(ok.pipeline_frame_id(1), "rear_optical");
        assert_eq!(c(&[], &[]).pipeline_frame_id(1), "camera_1");
        let one = Config { inputs: vec![gst.into()], ..Config::default() };
        assert_eq!(
            (one.pipeline_frame_id(0), one.pipeline_camera_name(0)),
            ("camera".into(), "camera".into())
        );
        let e = c(&["x"], &[]).validate().unwrap_err().to_string();
        assert!(e.contains("input_frame_ids") && e.contains("1 entries for 2 inputs"), "{e}");
        let e = c(&["front", ""], &[]).validate().unwrap_err().to_string();
        assert!(
            e.contains("input_frame_ids") && e.contains("item 0") && e.contains("is a topic"),
            "{e}"
        );
        let e = c(&[], &["", "/tmp/rear.yaml"]).validate().unwrap_err().to_string();
        assert!(e.contains("camera_info_urls") && e.contains("file://"), "{e}");
    }

    #[test]
    #[cfg_attr(
        not(feature = "gstreamer"),
        ignore = "a `gst:` input is valid only with the feature gstreamer"
    )]
    fn transports_per_input_default_to_image_transport() {
        let c = |image_transport, per: &[&str]| Config {
            inputs: vec!["front/image".into(), "rear/image".into(), "gst:videotestsrc".into()],
            image_transport,
            input_transports: per.iter().map(|s| s.to_string()).collect(),
            ..Config::default()
        };
        let all = c(Transport::Compressed, &[]);
        all.validate().unwrap();
        assert_eq!(all.input_transport(1), Transport::Compressed);
        let mixed = c(Transport::Raw, &["compressed", "", ""]);
        mixed.validate().unwrap();
        assert_eq!(
            (mixed.input_transport(0), mixed.input_transport(1)),
            (Transport::Compressed, Transport::Raw)
        );
        assert_eq!(Config::default().input_transport(0), Transport::Raw);
        // The most compressed frames of a set: the topic inputs that take them, never a
        // pipeline's.
        assert_eq!((all.compressed_inputs(), mixed.compressed_inputs()), (2, 1));
        assert_eq!(Config::default().compressed_inputs(), 0);
        let single = Config { image_transport: Transport::Compressed, ..Config::default() };
        assert_eq!(single.compressed_inputs(), 1);
        let e = c(Transport::Raw, &["jpeg", "", ""]).validate().unwrap_err().to_string();
        assert!(e.contains("input_transports") && e.contains("\"compressed\""), "{e}");
        let e = c(Transport::Raw, &["", "", "raw"]).validate().unwrap_err().to_string();
        assert!(e.contains("item 2") && e.contains("gst: pipeline"), "{e}");
        let e = c(Transport::Raw, &["raw"]).validate().unwrap_err().to_string();
        assert!(e.contains("1 entries for 3 inputs"), "{e}");
    }
}

#[cfg(test)]
mod preset_tests {
    use super::*;

    /// Every shipped parameters file parses and validates (the presets users start from).
    #[test]
    fn every_shipped_config_file_is_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                Config::from_yaml_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                n += 1;
            }
        }
        assert!(n >= 3, "expected default.yaml and at least two presets, found {n}");
        let yolo = Config::from_yaml_file(&dir.join("yolo_640_letterbox.yaml")).unwrap();
        assert_eq!(
            (yolo.network_image_width, yolo.pad_value[0], yolo.tensor_name.as_str()),
            (640, 114.0, "images")
        );
    }
}
