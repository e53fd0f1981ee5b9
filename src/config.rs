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
        }
    }
}

/// Largest network width or height accepted.
pub const MAX_NETWORK_SIZE: u32 = 8192;
/// Largest conv2d kernel size.
pub const MAX_CONV_SIZE: u32 = 15;

impl Config {
    /// Parse a YAML file in the ROS `<node>: ros__parameters: {...}` shape (the node name
    /// may be anything, including `/**`), or a bare mapping of parameters. Validated.
    pub fn from_yaml_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        Self::from_yaml_str(&text, &path.display().to_string())
    }

    /// [`Config::from_yaml_file`] on a string; `context` names the source in errors.
    pub fn from_yaml_str(text: &str, context: &str) -> Result<Config> {
        Self::from_yaml_str_with_overrides(text, context, &[])
    }

    /// [`Config::from_yaml_str`], then `overrides` applied in order before validation:
    /// each is `(dotted key, YAML value)`, e.g. `("conv.kernel", "box")` or
    /// `("roi", "[0, 0, 64, 48]")` (the command line's `--set key=value`).
    pub fn from_yaml_str_with_overrides(
        text: &str,
        context: &str,
        overrides: &[(String, String)],
    ) -> Result<Config> {
        let yaml_err = |e: serde_yaml::Error| Error::Yaml {
            context: context.to_string(),
            message: e.to_string(),
        };
        let doc: serde_yaml::Value = serde_yaml::from_str(text).map_err(yaml_err)?;
        let mut params = ros_parameters(&doc).unwrap_or(doc);
        if params.is_null() {
            params = serde_yaml::Value::Mapping(serde_yaml::Mapping::new());
        }
        for (key, value) in overrides {
            set_param(&mut params, key, value)?;
        }
        Self::from_yaml_value(params, context)
    }

    /// Deserialize and validate a mapping of parameters; errors name the parameter path
    /// (e.g. `conv.kernel: unknown variant ...`).
    pub fn from_yaml_value(params: serde_yaml::Value, context: &str) -> Result<Config> {
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
            if v == 0 || v > MAX_NETWORK_SIZE {
                return Err(Error::config(param, v, format!("use 1..={MAX_NETWORK_SIZE} pixels")));
            }
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
        if self.pad_value.iter().any(|v| !(0.0..=255.0).contains(v)) {
            return Err(Error::config(
                "pad_value",
                format!("{:?}", self.pad_value),
                "each value is a source pixel value in 8-bit units, 0..=255",
            ));
        }
        if !self.pixel_scale.is_finite() || self.pixel_scale == 0.0 {
            return Err(Error::config(
                "pixel_scale",
                self.pixel_scale,
                "use a finite, non-zero factor (e.g. 0.00392156862745098 = 1/255)",
            ));
        }
        if self.output_channels != 1 && self.output_channels != 3 {
            return Err(Error::config(
                "output_channels",
                self.output_channels,
                "use 1 (grey) or 3 (colour)",
            ));
        }
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
            if !(1..=100).contains(&v) {
                return Err(Error::config(param, v, "use a history depth of 1..=100"));
            }
        }
        if !self.debug_image_rate.is_finite() || self.debug_image_rate < 0.0 {
            return Err(Error::config(
                "debug_image_rate",
                self.debug_image_rate,
                "use a rate in Hz >= 0 (0 disables debug_image)",
            ));
        }
        Ok(())
    }

    /// The `conv.*` checks of [`Config::validate`].
    pub(crate) fn validate_conv(&self) -> Result<()> {
        let conv = &self.conv;
        if conv.kernel == ConvKernel::None {
            return Ok(());
        }
        let s = conv.size;
        if s % 2 == 0 || s == 0 || s > MAX_CONV_SIZE {
            return Err(Error::config(
                "conv.size",
                s,
                format!("use an odd size 1..={MAX_CONV_SIZE}"),
            ));
        }
        if conv.kernel == ConvKernel::Custom {
            let n = (s * s) as usize;
            if conv.weights.len() != n {
                return Err(Error::config(
                    "conv.weights",
                    format!("{} values", conv.weights.len()),
                    format!("custom needs conv.size*conv.size = {n} values, row-major"),
                ));
            }
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
        }
        if !conv.sigma.is_finite() {
            return Err(Error::config(
                "conv.sigma",
                conv.sigma,
                "use a finite sigma; <= 0 derives it from conv.size",
            ));
        }
        Ok(())
    }

    /// The value of `values` for output channel `c` (one value means all channels).
    pub fn per_channel(values: &[f64], c: usize) -> f64 {
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

/// Set the dotted parameter `key` of a parameter mapping to an already typed `value`
/// (see [`set_param`]).
pub fn set_value(
    params: &mut serde_yaml::Value,
    key: &str,
    parsed: serde_yaml::Value,
) -> Result<()> {
    use serde_yaml::Value;
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(Error::config(
            "--set",
            format!("{key:?}"),
            "give a parameter name, dotted for nested ones (e.g. conv.kernel)",
        ));
    }
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

/// `doc[<any node name>]["ros__parameters"]`, if the document has that shape.
fn ros_parameters(doc: &serde_yaml::Value) -> Option<serde_yaml::Value> {
    let map = doc.as_mapping()?;
    map.values().find_map(|node| node.as_mapping()?.get("ros__parameters").cloned())
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
        let msg = e.to_string();
        assert!(msg.contains("f.yaml") && msg.contains("unknown field `network_width`"), "{msg}");
    }

    #[test]
    fn errors_name_parameter_value_and_range() {
        let mut c = Config { network_image_width: 0, ..Config::default() };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "parameter `network_image_width`: 0 is invalid; use 1..=8192 pixels"
        );
        c = Config::default();
        c.conv.kernel = ConvKernel::Gaussian;
        c.conv.size = 4;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "parameter `conv.size`: 4 is invalid; use an odd size 1..=15"
        );
        c = Config { image_stddev: vec![0.5, 0.0, 0.5], ..Config::default() };
        assert!(c.validate().unwrap_err().to_string().starts_with("parameter `image_stddev`"));
        c = Config { roi: vec![1, 2, 3], ..Config::default() };
        assert!(c.validate().unwrap_err().to_string().contains("[x, y, width, height]"));
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
