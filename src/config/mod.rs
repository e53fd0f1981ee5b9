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
//!
//! By concern: the [`Config`] struct and its defaults here, the value types in
//! `types.rs`, the checks in `validate.rs`, reading YAML files and parameters in
//! `yaml.rs`.

mod types;
mod validate;
mod yaml;

use serde::{Deserialize, Serialize};

pub use types::*;
pub(crate) use validate::*;
#[cfg(test)]
pub(crate) use yaml::parameter_names;
pub(crate) use yaml::{closest_parameter, set_value};
pub use yaml::{set_param, Loaded, UnknownParameter};

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
    /// The transport of the image topics: `raw` (`sensor_msgs/Image`), `compressed`
    /// (`sensor_msgs/CompressedImage` on `<topic>/compressed`: JPEG, PNG, H.264, H.265),
    /// `foxglove` (`foxglove_msgs/CompressedVideo` on `<topic>/foxglove`) or `ffmpeg`
    /// (`ffmpeg_image_transport_msgs/FFMPEGPacket` on `<topic>/ffmpeg`), as
    /// image_transport's subscribers take it.
    pub image_transport: Transport,
    /// Per input, its transport where it differs from `image_transport` (`[]`, or one
    /// entry per input: `""` = `image_transport`, or a transport's name; a `gst:` input's
    /// entry must be `""`).
    pub input_transports: Vec<String>,
    /// The decoders of video inputs: auto | cpu | nvidia | jetson (docs/VIDEO.md).
    pub video_decoder: VideoDecoder,
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
            video_decoder: VideoDecoder::Auto,
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

impl Config {
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

    /// The value of `values` for output channel `c` (one value means all channels).
    pub(crate) fn per_channel(values: &[f64], c: usize) -> f64 {
        if values.len() == 1 {
            values[0]
        } else {
            values[c]
        }
    }
}
