//! The checks of [`Config::validate`]: each parameter's range (the ranges the ROS
//! descriptors state) and the rules between parameters.

use super::*;
use crate::error::{Error, Result};

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

impl Config {
    /// Check every value; the error names the parameter, the value and the valid range.
    pub fn validate(&self) -> Result<()> {
        for (param, v) in [
            ("network_image_width", self.network_image_width),
            ("network_image_height", self.network_image_height),
        ] {
            NETWORK_SIZE_RANGE.check(param, i64::from(v))?;
        }
        self.validate_roi()?;
        self.validate_normalization()?;
        self.validate_conv()?;
        self.validate_outputs()?;
        self.validate_batch()
    }

    /// `roi`: empty, or `[x, y, width, height]` inside 32 bits.
    fn validate_roi(&self) -> Result<()> {
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
        Ok(())
    }

    /// `pad_value`, `pixel_scale`, `output_channels`, `image_mean` and `image_stddev`.
    fn validate_normalization(&self) -> Result<()> {
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
        Ok(())
    }

    /// The outputs: `tensor_name`, `output_qos`, the QoS depths, the shared blocks and
    /// `debug_image_rate`.
    fn validate_outputs(&self) -> Result<()> {
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
        Ok(())
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
                    "give \"\" (image_transport's), \"raw\", \"compressed\", \"foxglove\" or \"ffmpeg\"",
                ));
            }
        }
        let video = (0..sources.len()).find(|&i| {
            matches!(sources[i], InputSource::Topic(_)) && self.input_transport(i).is_video()
        });
        if let (Some(i), false) = (video, cfg!(feature = "gstreamer")) {
            return Err(Error::config(
                "image_transport",
                format!("{} (input {i})", self.input_transport(i).name()),
                "video inputs are decoded by GStreamer, which this build does not have: build \
                 with the cargo feature `gstreamer` (a default one)",
            ));
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
        self.validate_urls_and_frame_ids()
    }

    /// Each `camera_info_urls` entry a `file://` URL; `input_frame_ids` without spaces.
    fn validate_urls_and_frame_ids(&self) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
