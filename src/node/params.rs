//! ROS parameters <-> [`Config`]. The node's parameters are exactly the fields of
//! `Config` (nested ones dotted, e.g. `conv.kernel`), declared with descriptions so that
//! `ros2 param list/get/describe` and rqt show them. Values are converted through a YAML
//! value so that serde does the typing and `Config::validate` the range checks: a bad
//! value at start-up stops the node with an error naming the parameter; a bad value set
//! at run time is refused (`ros2 param set` prints the reason) and the old one stays.

use crate::config::{set_value, Config};
use crate::error::Result;
use indexmap::IndexMap;
use r2r::{Parameter, ParameterValue, RosParams};
use serde_yaml::Value;

/// The ROS type of a parameter (arrays keep their type when empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
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
}

/// Every parameter: name, type, whether it can change while running, description.
/// A test checks this table lists exactly the fields of `Config`.
pub const PARAMETERS: &[(&str, Kind, bool, &str)] = &[
    ("network_image_width", Kind::Integer, true, "Network input width in pixels, 1..8192"),
    ("network_image_height", Kind::Integer, true, "Network input height in pixels, 1..8192"),
    (
        "roi",
        Kind::IntegerArray,
        true,
        "[x, y, width, height] of the source to use, applied first; [] = whole image",
    ),
    (
        "interpolation",
        Kind::Str,
        true,
        "linear (= cv2.INTER_LINEAR) | nearest (= cv2.INTER_NEAREST)",
    ),
    (
        "resize_mode",
        Kind::Str,
        true,
        "stretch | letterbox (aspect kept, padded) | center_crop (aspect kept, cropped)",
    ),
    (
        "pad_value",
        Kind::DoubleArray,
        true,
        "Letterbox padding [R, G, B] in source 8-bit units (normalized like a pixel)",
    ),
    ("letterbox_anchor", Kind::Str, true, "center | top_left"),
    (
        "pixel_scale",
        Kind::Double,
        true,
        "Factor from 8-bit pixel units (16-bit sources are divided by 257 first)",
    ),
    (
        "image_mean",
        Kind::DoubleArray,
        true,
        "Per output channel mean, subtracted after scaling (1 or C values)",
    ),
    (
        "image_stddev",
        Kind::DoubleArray,
        true,
        "Per output channel standard deviation (1 or C values, non-zero)",
    ),
    ("channel_order", Kind::Str, true, "rgb | bgr"),
    ("output_channels", Kind::Integer, true, "3 (colour; grey replicated) | 1 (grey)"),
    ("output_layout", Kind::Str, true, "NCHW | NHWC"),
    ("output_dtype", Kind::Str, true, "float32 | float16"),
    (
        "conv.kernel",
        Kind::Str,
        true,
        "none | box | gaussian | sharpen | sobel_x | sobel_y | laplacian | custom",
    ),
    ("conv.size", Kind::Integer, true, "Kernel size, odd, 1..15"),
    (
        "conv.sigma",
        Kind::Double,
        true,
        "Gaussian sigma in network pixels; <= 0 derives it from conv.size",
    ),
    ("conv.weights", Kind::DoubleArray, true, "size*size weights, row-major, for custom"),
    ("conv.border", Kind::Str, true, "replicate | constant (0) | reflect101"),
    ("tensor_name", Kind::Str, true, "Tensor.name of the published tensor"),
    ("backend", Kind::Str, false, "auto | cuda | cpu (start-up only)"),
    ("device_id", Kind::Integer, false, "CUDA device ordinal (start-up only)"),
    ("memory_mode", Kind::Str, false, "auto | upload | mapped (start-up only)"),
    (
        "gpu_failure_policy",
        Kind::Str,
        false,
        "On a CUDA failure: fallback (CPU) | retry (rebuild, then CPU) | exit (start-up only)",
    ),
    (
        "input_qos",
        Kind::Str,
        false,
        "auto (publishers' QoS) | sensor_data | default | system_default (start-up only)",
    ),
    (
        "input_qos_depth",
        Kind::Integer,
        false,
        "History depth of the inputs, 1..100 (start-up only)",
    ),
    ("output_qos", Kind::Str, false, "sensor_data | default | system_default (start-up only)"),
    (
        "output_qos_depth",
        Kind::Integer,
        false,
        "History depth of the outputs, 1..100 (start-up only)",
    ),
    (
        "debug_image_rate",
        Kind::Double,
        true,
        "Highest debug_image rate in Hz, computed only while subscribed; 0 = off",
    ),
];

/// Parameters every node has that are not ours (left alone).
fn is_foreign(name: &str) -> bool {
    name == "use_sim_time" || name.starts_with("qos_overrides.")
}

fn declared(name: &str) -> Option<(Kind, bool, &'static str)> {
    PARAMETERS.iter().find(|p| p.0 == name).map(|p| (p.1, p.2, p.3))
}

/// Build a validated configuration from the defaults overlaid with `params`.
pub fn config_from_params<'a>(
    params: impl IntoIterator<Item = (&'a str, &'a ParameterValue)>,
) -> Result<Config> {
    let mut doc = config_doc(&Config::default());
    for (name, value) in params {
        if !is_foreign(name) {
            set_value(&mut doc, name, yaml_of(value))?;
        }
    }
    Config::from_yaml_value(doc, "ROS parameters")
}

fn config_doc(cfg: &Config) -> Value {
    // Serializing a plain struct of numbers, strings and vectors cannot fail.
    serde_yaml::to_value(cfg).unwrap_or(Value::Null)
}

fn yaml_of(v: &ParameterValue) -> Value {
    let seq = |it: Vec<Value>| Value::Sequence(it);
    match v {
        // rcl's YAML parser gives an empty array (`roi: []`) no type: it arrives as "not
        // set". Every parameter that can be empty is an array, so read it as `[]`.
        ParameterValue::NotSet => seq(Vec::new()),
        ParameterValue::Bool(b) => Value::Bool(*b),
        ParameterValue::Integer(i) => Value::Number((*i).into()),
        ParameterValue::Double(d) => Value::Number((*d).into()),
        ParameterValue::String(s) => Value::String(s.clone()),
        ParameterValue::BoolArray(a) => seq(a.iter().map(|b| Value::Bool(*b)).collect()),
        ParameterValue::ByteArray(a) => seq(a.iter().map(|b| Value::Number((*b).into())).collect()),
        ParameterValue::IntegerArray(a) => {
            seq(a.iter().map(|i| Value::Number((*i).into())).collect())
        }
        ParameterValue::DoubleArray(a) => {
            seq(a.iter().map(|d| Value::Number((*d).into())).collect())
        }
        ParameterValue::StringArray(a) => seq(a.iter().map(|s| Value::String(s.clone())).collect()),
    }
}

/// The ROS value of `name` in `cfg`, typed by the table.
fn value_of(cfg: &Config, name: &str, kind: Kind) -> ParameterValue {
    let doc = config_doc(cfg);
    let mut v = &doc;
    for part in name.split('.') {
        v = v.get(part).unwrap_or(&Value::Null);
    }
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    match kind {
        Kind::Integer => ParameterValue::Integer(v.as_i64().unwrap_or(0)),
        Kind::Double => ParameterValue::Double(f(v)),
        Kind::Str => ParameterValue::String(v.as_str().unwrap_or("").to_string()),
        Kind::IntegerArray => ParameterValue::IntegerArray(
            v.as_sequence()
                .map(|s| s.iter().map(|x| x.as_i64().unwrap_or(0)).collect())
                .unwrap_or_default(),
        ),
        Kind::DoubleArray => ParameterValue::DoubleArray(
            v.as_sequence().map(|s| s.iter().map(f).collect()).unwrap_or_default(),
        ),
    }
}

/// The node's live configuration, served to `ros2 param` by r2r's parameter handler.
/// `generation` counts accepted changes so the processing thread can pick them up.
#[derive(Debug, Clone)]
pub struct NodeParams {
    /// The configuration in force.
    pub config: Config,
    /// Incremented by every accepted run-time change.
    pub generation: u64,
}

impl NodeParams {
    /// Wrap a validated configuration.
    pub fn new(config: Config) -> Self {
        NodeParams { config, generation: 0 }
    }

    /// The configuration with `name` set to `value`, validated; the error says why not.
    fn with(&self, name: &str, value: &ParameterValue) -> std::result::Result<Config, String> {
        let Some((kind, runtime, _)) = declared(name) else {
            return Err(format!("`{name}` is not a parameter of vision_preproc"));
        };
        if !runtime {
            return Err(format!(
                "`{name}` can only be set at start-up (restart the node with the new value)"
            ));
        }
        let ok_type = matches!(
            (kind, value),
            (Kind::Integer, ParameterValue::Integer(_))
                | (Kind::Double, ParameterValue::Double(_) | ParameterValue::Integer(_))
                | (Kind::Str, ParameterValue::String(_))
                | (Kind::IntegerArray, ParameterValue::IntegerArray(_) | ParameterValue::NotSet)
                | (
                    Kind::DoubleArray,
                    ParameterValue::DoubleArray(_)
                        | ParameterValue::IntegerArray(_)
                        | ParameterValue::NotSet
                )
        );
        if !ok_type {
            return Err(format!("`{name}` must be of type {kind:?}, got {}", value.type_name()));
        }
        let mut doc = config_doc(&self.config);
        set_value(&mut doc, name, yaml_of(value)).map_err(|e| e.to_string())?;
        Config::from_yaml_value(doc, "parameter").map_err(|e| e.to_string())
    }
}

fn refuse(name: &str, msg: String) -> r2r::Error {
    r2r::Error::ParameterValueConv { name: name.to_string(), msg }
}

impl RosParams for NodeParams {
    fn register_parameters(
        &mut self,
        _prefix: &str,
        _param: Option<Parameter>,
        params: &mut IndexMap<String, Parameter>,
    ) -> r2r::Result<()> {
        for (name, kind, _, description) in PARAMETERS {
            params.shift_remove(*name);
            params.insert(
                (*name).to_string(),
                Parameter { value: value_of(&self.config, name, *kind), description },
            );
        }
        Ok(())
    }

    fn get_parameter(&mut self, name: &str) -> r2r::Result<ParameterValue> {
        let (kind, _, _) = declared(name)
            .ok_or_else(|| r2r::Error::InvalidParameterName { name: name.to_string() })?;
        Ok(value_of(&self.config, name, kind))
    }

    fn set_parameter(&mut self, name: &str, value: &ParameterValue) -> r2r::Result<()> {
        let config = self.with(name, value).map_err(|m| refuse(name, m))?;
        if config != self.config {
            self.config = config;
            self.generation += 1;
        }
        Ok(())
    }

    fn check_parameter(&self, name: &str, value: &ParameterValue) -> r2r::Result<()> {
        self.with(name, value).map(|_| ()).map_err(|m| refuse(name, m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat_keys(v: &Value, prefix: &str, out: &mut Vec<String>) {
        if let Some(map) = v.as_mapping() {
            for (k, v) in map {
                let k = format!("{prefix}{}", k.as_str().unwrap_or(""));
                if v.is_mapping() {
                    flat_keys(v, &format!("{k}."), out);
                } else {
                    out.push(k);
                }
            }
        }
    }

    #[test]
    fn the_table_lists_exactly_the_config_fields_with_their_types() {
        let mut keys = Vec::new();
        flat_keys(&config_doc(&Config::default()), "", &mut keys);
        let table: Vec<&str> = PARAMETERS.iter().map(|p| p.0).collect();
        assert_eq!(keys, table, "PARAMETERS must follow Config's fields, in order");
        // Round trip: typed values of the defaults rebuild the defaults.
        let values: Vec<(&str, ParameterValue)> = PARAMETERS
            .iter()
            .map(|(n, k, _, _)| (*n, value_of(&Config::default(), n, *k)))
            .collect();
        let cfg = config_from_params(values.iter().map(|(n, v)| (*n, v))).unwrap();
        assert_eq!(cfg, Config::default());
        assert_eq!(
            value_of(&Config::default(), "roi", Kind::IntegerArray),
            ParameterValue::IntegerArray(vec![])
        );
        assert_eq!(
            value_of(&Config::default(), "conv.kernel", Kind::Str),
            ParameterValue::String("none".into())
        );
    }

    #[test]
    fn dotted_and_typed_parameters_build_the_config() {
        let p = [
            ("network_image_width", ParameterValue::Integer(320)),
            ("conv.kernel", ParameterValue::String("none".into())),
            ("image_mean", ParameterValue::DoubleArray(vec![0.485, 0.456, 0.406])),
            ("pad_value", ParameterValue::IntegerArray(vec![114, 114, 114])),
            ("use_sim_time", ParameterValue::Bool(false)),
            ("roi", ParameterValue::NotSet),
        ];
        let cfg = config_from_params(p.iter().map(|(n, v)| (*n, v))).unwrap();
        assert_eq!(cfg.network_image_width, 320);
        assert_eq!(cfg.image_mean, vec![0.485, 0.456, 0.406]);
        assert_eq!(cfg.pad_value, vec![114.0, 114.0, 114.0]);
    }

    #[test]
    fn unknown_and_mistyped_parameters_are_named() {
        let p = [("network_width", ParameterValue::Integer(3))];
        let e = config_from_params(p.iter().map(|(n, v)| (*n, v))).unwrap_err().to_string();
        assert!(e.contains("unknown field `network_width`"), "{e}");
        let p = [("output_layout", ParameterValue::String("CHW".into()))];
        let e = config_from_params(p.iter().map(|(n, v)| (*n, v))).unwrap_err().to_string();
        assert!(e.contains("output_layout") && e.contains("CHW"), "{e}");
    }

    #[test]
    fn run_time_changes_are_validated_and_counted() {
        let mut p = NodeParams::new(Config::default());
        p.set_parameter("image_mean", &ParameterValue::DoubleArray(vec![0.1, 0.2, 0.3])).unwrap();
        assert_eq!((p.generation, p.config.image_mean.clone()), (1, vec![0.1, 0.2, 0.3]));
        // Same value again: no new generation.
        p.set_parameter("image_mean", &ParameterValue::DoubleArray(vec![0.1, 0.2, 0.3])).unwrap();
        assert_eq!(p.generation, 1);
        p.set_parameter("conv.kernel", &ParameterValue::String("box".into())).unwrap();
        let e = p.set_parameter("conv.size", &ParameterValue::Integer(4)).unwrap_err();
        assert!(e.to_string().contains("odd size"), "{e}");
        assert_eq!((p.config.conv.size, p.generation), (3, 2));
        let e = p.set_parameter("network_image_width", &ParameterValue::Integer(0)).unwrap_err();
        assert!(e.to_string().contains("use 1..=8192 pixels"), "{e}");
        let e = p.set_parameter("backend", &ParameterValue::String("cpu".into())).unwrap_err();
        assert!(e.to_string().contains("only be set at start-up"), "{e}");
        let e = p.set_parameter("pixel_scale", &ParameterValue::String("x".into())).unwrap_err();
        assert!(e.to_string().contains("must be of type Double"), "{e}");
        // An integer for a double parameter is taken (ros2 param set x 1).
        p.set_parameter("pixel_scale", &ParameterValue::Integer(1)).unwrap();
        assert_eq!(p.config.pixel_scale, 1.0);
        assert_eq!(p.generation, 3);
    }
}
