//! The table of the node's parameters: each one's [`Spec`] (type, read-only, description,
//! range, constraints) and its full `ParameterDescriptor`.

use crate::config::{
    FloatRange, IntRange, BATCH_QUEUE_RANGE, BATCH_TIMEOUT_RANGE, CONV_SIZE_RANGE,
    MAX_INTERVAL_RANGE, NETWORK_SIZE_RANGE, OUTPUT_CHANNELS_RANGE, PAD_VALUE_RANGE,
    QOS_DEPTH_RANGE, SHARED_LEASE_RANGE, SHARED_POOL_RANGE, STALE_AFTER_RANGE,
};
use r2r::rcl_interfaces::msg::{
    FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType as T,
};

/// The ROS type of a parameter (arrays keep their type when empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `bool`.
    Bool,
    /// `integer`.
    Integer,
    /// `double`.
    Double,
    /// `string`.
    Str,
    /// `integer array`.
    IntegerArray,
    /// `double array`.
    DoubleArray,
    /// `string array`.
    StrArray,
}

impl Kind {
    /// `rcl_interfaces/ParameterType` of this kind.
    pub(crate) fn ros_type(self) -> u8 {
        match self {
            Kind::Bool => T::PARAMETER_BOOL as u8,
            Kind::Integer => T::PARAMETER_INTEGER as u8,
            Kind::Double => T::PARAMETER_DOUBLE as u8,
            Kind::Str => T::PARAMETER_STRING as u8,
            Kind::IntegerArray => T::PARAMETER_INTEGER_ARRAY as u8,
            Kind::DoubleArray => T::PARAMETER_DOUBLE_ARRAY as u8,
            Kind::StrArray => T::PARAMETER_STRING_ARRAY as u8,
        }
    }

    /// The name `ros2 param describe` prints.
    pub(in crate::ros::node) fn name(self) -> &'static str {
        match self {
            Kind::Bool => "boolean",
            Kind::Integer => "integer",
            Kind::Double => "double",
            Kind::Str => "string",
            Kind::IntegerArray => "integer array",
            Kind::DoubleArray => "double array",
            Kind::StrArray => "string array",
        }
    }
}

/// The range a descriptor states.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::ros::node) enum Range {
    /// No numeric range.
    None,
    /// `integer_range`.
    Int(IntRange),
    /// `floating_point_range` (for a double array: each value).
    Float(FloatRange),
}

/// One parameter of the node: what `ros2 param describe` shows of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec {
    /// The name (dotted for nested ones).
    pub name: &'static str,
    /// The type.
    pub kind: Kind,
    /// Start-up only (`ParameterDescriptor.read_only`).
    pub read_only: bool,
    /// `ParameterDescriptor.description`.
    pub description: &'static str,
    /// `integer_range` / `floating_point_range`.
    pub range: Range,
    /// `ParameterDescriptor.additional_constraints`: the rules a range cannot state.
    pub constraints: &'static str,
}

const fn spec(
    name: &'static str,
    kind: Kind,
    read_only: bool,
    description: &'static str,
    range: Range,
    constraints: &'static str,
) -> Spec {
    Spec { name, kind, read_only, description, range, constraints }
}

/// `use_sim_time`: every ROS node has it.
pub(crate) const USE_SIM_TIME: Spec = spec(
    "use_sim_time",
    Kind::Bool,
    false,
    "Use the time published on /clock (ros2 bag play --clock, a simulator) as the node's clock",
    Range::None,
    "age_us, the /diagnostics period and rates, the debug_image rate limit and the stamps the \
     node makes follow the node's clock",
);

use Kind::*;
use Range::{Float, Int, None as NoRange};

/// Every parameter of `Config`, in field order (a test checks this table lists exactly the
/// fields of `Config`, with their types).
pub(crate) const PARAMETERS: &[Spec] = &[
    spec("network_image_width", Integer, false, "Network input width in pixels", Int(NETWORK_SIZE_RANGE), ""),
    spec("network_image_height", Integer, false, "Network input height in pixels", Int(NETWORK_SIZE_RANGE), ""),
    spec(
        "roi",
        IntegerArray,
        false,
        "[x, y, width, height] of the source to use, applied first; [] = whole image",
        NoRange,
        "[] or 4 values: x >= 0, y >= 0, width >= 1, height >= 1 (frames it does not fit are rejected)",
    ),
    spec(
        "interpolation",
        Str,
        false,
        "Resampling: linear (= cv2.INTER_LINEAR) or nearest (= cv2.INTER_NEAREST)",
        NoRange,
        "one of: linear, nearest",
    ),
    spec(
        "resize_mode",
        Str,
        false,
        "stretch, letterbox (aspect kept, padded) or center_crop (aspect kept, cropped)",
        NoRange,
        "one of: stretch, letterbox, center_crop",
    ),
    spec(
        "pad_value",
        DoubleArray,
        false,
        "Letterbox padding [R, G, B] in source 8-bit units (normalized like a pixel)",
        Float(PAD_VALUE_RANGE),
        "1 value (all channels) or 3; the range applies to each value",
    ),
    spec("letterbox_anchor", Str, false, "Where a letterboxed image sits", NoRange, "one of: center, top_left"),
    spec(
        "pixel_scale",
        Double,
        false,
        "Factor from 8-bit pixel units (16-bit sources are divided by 257 first)",
        NoRange,
        "finite and non-zero",
    ),
    spec(
        "image_mean",
        DoubleArray,
        false,
        "Per output channel mean, subtracted after scaling",
        NoRange,
        "1 value or output_channels values, finite",
    ),
    spec(
        "image_stddev",
        DoubleArray,
        false,
        "Per output channel standard deviation, divided by",
        NoRange,
        "1 value or output_channels values, finite and non-zero",
    ),
    spec("channel_order", Str, false, "Output channel order", NoRange, "one of: rgb, bgr"),
    spec(
        "output_channels",
        Integer,
        false,
        "3 (colour; grey sources replicated) or 1 (grey)",
        Int(OUTPUT_CHANNELS_RANGE),
        "image_mean and image_stddev need 1 value or this many",
    ),
    spec("output_layout", Str, false, "Output memory layout", NoRange, "one of: NCHW, NHWC"),
    spec("output_dtype", Str, false, "Output element type", NoRange, "one of: float32, float16"),
    spec(
        "conv.kernel",
        Str,
        false,
        "conv2d after normalization",
        NoRange,
        "one of: none, box, gaussian, sharpen, sobel_x, sobel_y, laplacian, custom; custom needs \
         conv.size*conv.size conv.weights",
    ),
    spec(
        "conv.size",
        Integer,
        false,
        "Kernel size (odd); sobel_x, sobel_y and laplacian take 1 as OpenCV's ksize=1",
        Int(CONV_SIZE_RANGE),
        "",
    ),
    spec(
        "conv.sigma",
        Double,
        false,
        "Gaussian sigma in network pixels (gaussian, sharpen)",
        NoRange,
        "finite; <= 0 derives it from conv.size as OpenCV does",
    ),
    spec(
        "conv.weights",
        DoubleArray,
        false,
        "Weights, row-major, for conv.kernel custom",
        NoRange,
        "finite, within float32 range; conv.size*conv.size values when conv.kernel is custom",
    ),
    spec("conv.border", Str, false, "How conv2d reads outside the image", NoRange, "one of: replicate, constant, reflect101"),
    spec("tensor_name", Str, false, "Tensor.name of the published tensor", NoRange, "not empty"),
    spec(
        "backend",
        Str,
        true,
        "auto (CUDA when usable, else CPU with a warning), cuda or cpu",
        NoRange,
        "one of: auto, cuda, cpu",
    ),
    spec(
        "device_id",
        Integer,
        true,
        "CUDA device ordinal",
        Int(IntRange { from: 0, to: i32::MAX as i64, step: 1 }),
        "an existing device (nvidia-smi -L)",
    ),
    spec(
        "memory_mode",
        Str,
        true,
        "How frames reach the GPU: auto (mapped on integrated GPUs), upload or mapped",
        NoRange,
        "one of: auto, upload, mapped",
    ),
    spec(
        "gpu_failure_policy",
        Str,
        true,
        "On a CUDA failure while running: fallback (CPU), retry (rebuild, then CPU) or exit",
        NoRange,
        "one of: fallback, retry, exit",
    ),
    spec(
        "input_qos",
        Str,
        true,
        "QoS of image and camera_info: auto (what the publishers offer, re-chosen as they come and go), sensor_data, default or system_default",
        NoRange,
        "one of: auto, sensor_data, default, system_default",
    ),
    spec("input_qos_depth", Integer, true, "History depth of the inputs", Int(QOS_DEPTH_RANGE), ""),
    spec("output_qos", Str, true, "QoS of the published topics", NoRange, "one of: sensor_data, default, system_default"),
    spec("output_qos_depth", Integer, true, "History depth of the outputs", Int(QOS_DEPTH_RANGE), ""),
    spec(
        "debug_image_rate",
        Double,
        false,
        "Highest debug_image rate in Hz (on the node's clock), computed only while subscribed",
        NoRange,
        "finite, >= 0; 0 disables debug_image",
    ),
    spec(
        "inputs",
        StrArray,
        true,
        "Inputs: image topics (relative names) or gst:<GStreamer launch description> (a camera inside the node); [] = the single input image; 2 or more: one TensorBatch on tensor, item i from inputs[i]",
        NoRange,
        "at most 16 entries, each once: valid topic names or gst: with a description",
    ),
    spec(
        "input_frame_ids",
        StrArray,
        true,
        "Per input, header.frame_id of a gst: input's frames; [] or one entry per input, \"\" = camera (camera_<i> with 2+ inputs)",
        NoRange,
        "[] or one entry per input; \"\" for topic inputs",
    ),
    spec(
        "camera_info_urls",
        StrArray,
        true,
        "Per input, a gst: input's calibration (file:// URL of a ROS camera calibration YAML); [] or one entry per input, \"\" = none",
        NoRange,
        "[] or one entry per input; file:// URLs; \"\" for topic inputs",
    ),
    spec(
        "image_transport",
        Str,
        true,
        "Transport of the image topics, as image_transport subscribers take it: raw (sensor_msgs/Image), compressed (sensor_msgs/CompressedImage on <topic>/compressed: JPEG or PNG decoded where the kernels run, H.264 or H.265 by the video decoder), foxglove (foxglove_msgs/CompressedVideo on <topic>/foxglove) or ffmpeg (ffmpeg_image_transport_msgs/FFMPEGPacket on <topic>/ffmpeg)",
        NoRange,
        "one of: raw, compressed, foxglove, ffmpeg",
    ),
    spec(
        "input_transports",
        StrArray,
        true,
        "Per input, its transport where it differs from image_transport; [] or one entry per input, \"\" = image_transport, raw, compressed, foxglove or ffmpeg (\"\" for gst: inputs)",
        NoRange,
        "[] or one entry per input: \"\", raw, compressed, foxglove or ffmpeg; \"\" for gst: inputs",
    ),
    spec(
        "video_decoder",
        Str,
        true,
        "Decoders of video inputs: auto (NVIDIA's nvcodec where registered, else the CPU's), cpu (gstreamer1.0-libav), nvidia (nvcodec) or jetson (nvv4l2decoder, untested); docs/VIDEO.md",
        NoRange,
        "one of: auto, cpu, nvidia, jetson",
    ),
    spec(
        "batch_policy",
        Str,
        true,
        "How a batch is formed (2+ inputs): latest (newest frame of each camera) or approximate_time (message_filters' rule over header stamps)",
        NoRange,
        "one of: latest, approximate_time",
    ),
    spec(
        "batch_timeout_ms",
        Integer,
        true,
        "latest: ms after the first new frame before a batch goes out without the cameras that have no new frame (they repeat their last)",
        Int(BATCH_TIMEOUT_RANGE),
        "",
    ),
    spec(
        "max_interval_ms",
        Integer,
        true,
        "approximate_time: largest spread of header stamps in one batch, ms",
        Int(MAX_INTERVAL_RANGE),
        "",
    ),
    spec(
        "stale_after_ms",
        Integer,
        true,
        "A camera without a frame for this many ms is stale: not waited for, its slot padded and flagged invalid until its next frame",
        Int(STALE_AFTER_RANGE),
        "",
    ),
    spec(
        "batch_queue_size",
        Integer,
        true,
        "approximate_time: frames kept per camera while looking for a set",
        Int(BATCH_QUEUE_RANGE),
        "",
    ),
    spec(
        "input_participants",
        Str,
        true,
        "Which DDS participant takes the input images: one (the node's) or per_input (each input its own, a hidden node _<node>_input<i>: one receive thread per camera, for the highest frame rates; one more shared-memory segment each)",
        NoRange,
        "one of: one, per_input",
    ),
    spec(
        "shared_pool_size",
        Integer,
        true,
        "Shared output blocks for tensor_ref (zero-copy hand-off, docs/HANDOFF.md); 0: no tensor_ref",
        Int(SHARED_POOL_RANGE),
        "",
    ),
    spec(
        "shared_lease_ms",
        Integer,
        true,
        "A tensor_ref consumer holding a block longer (ms) is disconnected and its blocks taken back",
        Int(SHARED_LEASE_RANGE),
        "",
    ),
];

/// The spec of `name`, `use_sim_time` included.
pub(in crate::ros::node) fn spec_of(name: &str) -> Option<&'static Spec> {
    PARAMETERS.iter().chain([&USE_SIM_TIME]).find(|s| s.name == name)
}

/// The full descriptor of a parameter.
pub(crate) fn descriptor(s: &Spec) -> ParameterDescriptor {
    let (integer_range, floating_point_range) = match s.range {
        Range::None => (vec![], vec![]),
        Range::Int(r) => {
            (vec![IntegerRange { from_value: r.from, to_value: r.to, step: r.step }], vec![])
        }
        Range::Float(r) => {
            (vec![], vec![FloatingPointRange { from_value: r.from, to_value: r.to, step: 0.0 }])
        }
    };
    let constraints = if s.read_only && s.constraints.is_empty() {
        "read-only: set it at start-up (parameters file, -p)".to_string()
    } else if s.read_only {
        format!("{}; read-only: set it at start-up (parameters file, -p)", s.constraints)
    } else {
        s.constraints.to_string()
    };
    ParameterDescriptor {
        name: s.name.to_string(),
        type_: s.kind.ros_type(),
        description: s.description.to_string(),
        additional_constraints: constraints,
        read_only: s.read_only,
        dynamic_typing: false,
        floating_point_range,
        integer_range,
    }
}
