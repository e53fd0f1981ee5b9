//! ROS parameters <-> [`Config`]. The node's parameters are exactly the fields of
//! `Config` (nested ones dotted, e.g. `conv.kernel`) plus `use_sim_time`, each described by
//! a [`Spec`]: type, whether it is read-only (start-up only), description, range and
//! constraints, served as full `rcl_interfaces/ParameterDescriptor`s (`ros2 param
//! describe`, rqt_reconfigure's sliders).
//!
//! A value is checked as rclcpp checks one (declared? read-only? type? range?), then the
//! configuration it makes is validated as a whole (`Config::validate`), so rules between
//! parameters (`conv.weights` vs `conv.size` for `custom`, `image_mean` vs
//! `output_channels`) are checked on the resulting configuration whatever the order of
//! the changes. Refusals are in ROS words (`network_image_width must be in [1, 8192] (got
//! 0)`). One deliberate difference from rclcpp: an integer is accepted for a double
//! parameter (and an integer array for a double array), converted, and reported and
//! logged as the double (`ros2 param set /vision_preproc debug_image_rate 5` sets 5.0;
//! rclcpp refuses it with "Wrong parameter type", see ros2/rclcpp#979).
//!
//! The table of parameters is in `specs.rs`, the conversions of values in `values.rs`.

mod specs;
mod values;

pub(crate) use specs::*;
pub(in crate::ros::node) use values::*;

use crate::config::{self, Config, UnknownParameter};
use crate::error::{Error, Result};
use r2r::rcl_interfaces::msg::ListParametersResult;
#[cfg(test)]
use r2r::rcl_interfaces::msg::ParameterType as T;
use r2r::ParameterValue;
use serde_yaml::Value;

fn config_doc(cfg: &Config) -> Value {
    // Serializing a plain struct of numbers, strings and vectors cannot fail.
    serde_yaml::to_value(cfg).unwrap_or(Value::Null)
}

/// The ROS value of `name` in `cfg`, typed by its spec.
fn value_of(cfg: &Config, s: &Spec) -> ParameterValue {
    let doc = config_doc(cfg);
    let mut v = &doc;
    for part in s.name.split('.') {
        v = v.get(part).unwrap_or(&Value::Null);
    }
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    match s.kind {
        Kind::Bool => ParameterValue::Bool(v.as_bool().unwrap_or(false)),
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
        Kind::StrArray => ParameterValue::StringArray(
            v.as_sequence()
                .map(|s| s.iter().map(|x| x.as_str().unwrap_or("").to_string()).collect())
                .unwrap_or_default(),
        ),
    }
}

/// The parameter an error is about, if it names one.
fn error_param(e: &Error) -> Option<&str> {
    match e {
        Error::Config { param, .. }
        | Error::Range { param, .. }
        | Error::ParameterType { param, .. } => Some(param),
        _ => None,
    }
}

/// The node's parameters: the configuration in force and `use_sim_time`. `generation`
/// counts accepted changes of the configuration so the processing thread picks them up.
#[derive(Debug, Clone)]
pub(crate) struct NodeParams {
    /// The configuration in force.
    pub config: Config,
    /// `use_sim_time`.
    pub use_sim_time: bool,
    /// Incremented by every accepted change of `config`.
    pub generation: u64,
    /// The managed node is unconfigured: read-only parameters may be set too (they apply
    /// at the next configure).
    pub unconfigured: bool,
}

/// One accepted change: the name and the value as stored (converted to the parameter's
/// type).
pub(super) type Change = (String, ParameterValue);

impl NodeParams {
    /// Wrap a validated configuration (the tests; the node starts from its parameters).
    #[cfg(test)]
    pub(crate) fn new(config: Config) -> Self {
        NodeParams { config, use_sim_time: false, generation: 0, unconfigured: false }
    }

    /// The parameters the node was started with (`--params-file`, `-p`; r2r gives them
    /// merged) over the defaults: each value typed and range-checked, the configuration
    /// validated; unknown names are returned (the node warns and ignores them).
    pub(crate) fn from_overrides<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a ParameterValue)>,
    ) -> Result<(NodeParams, Vec<UnknownParameter>)> {
        let mut use_sim_time = false;
        let mut values = Vec::new();
        for (name, value) in params {
            match spec_of(name) {
                Some(s) if s.name == USE_SIM_TIME.name => {
                    use_sim_time = matches!(coerce(s, value, true)?, ParameterValue::Bool(true));
                }
                Some(s) => values.push((name.to_string(), yaml_of(&coerce(s, value, true)?))),
                None => values.push((name.to_string(), yaml_of(value))),
            }
        }
        let loaded = Config::from_params(values, "parameters")?;
        let params =
            NodeParams { config: loaded.config, use_sim_time, generation: 0, unconfigured: false };
        Ok((params, loaded.unknown))
    }

    /// The value of a parameter, `None` if the node has no such parameter.
    pub(crate) fn get(&self, name: &str) -> Option<ParameterValue> {
        let s = spec_of(name)?;
        Some(if s.name == USE_SIM_TIME.name {
            ParameterValue::Bool(self.use_sim_time)
        } else {
            value_of(&self.config, s)
        })
    }

    /// `(config, use_sim_time)` with `name` set to `value` on top of the given ones, and the
    /// value as stored; the refusal in ROS words.
    fn with(
        &self,
        base: &(Config, bool),
        name: &str,
        value: &ParameterValue,
    ) -> std::result::Result<((Config, bool), ParameterValue), String> {
        let Some(s) = spec_of(name) else {
            let names: Vec<String> = all_names().iter().map(|n| n.to_string()).collect();
            let hint = config::closest_parameter(name, &names)
                .map(|c| format!("; did you mean '{c}'?"))
                .unwrap_or_default();
            return Err(format!("parameter '{name}' is not declared by vision_preproc{hint}"));
        };
        if s.read_only && !self.unconfigured {
            return Err(format!(
                "parameter '{name}' cannot be set because it is read-only (start-up only: \
                 restart the node with the new value)"
            ));
        }
        if matches!(value, ParameterValue::NotSet) {
            return Err(format!(
                "parameter '{name}' cannot be undeclared (deleted): it is statically typed ({}); \
                 set a value instead",
                s.kind.name()
            ));
        }
        let typed = coerce(s, value, false).map_err(|e| e.to_string())?;
        if s.name == USE_SIM_TIME.name {
            return Ok(((base.0.clone(), matches!(typed, ParameterValue::Bool(true))), typed));
        }
        let mut doc = config_doc(&base.0);
        config::set_value(&mut doc, name, yaml_of(&typed)).map_err(|e| e.to_string())?;
        match Config::from_yaml_value(doc, "parameters") {
            Ok(cfg) => Ok(((cfg, base.1), typed)),
            Err(e) if error_param(&e).is_some_and(|p| p != name) => Err(format!(
                "{name} = {} conflicts with the other parameters: {e} (set them in one \
                 request: ros2 param load, or set_parameters_atomically)",
                show(&typed)
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    fn commit(&mut self, next: (Config, bool)) {
        if next.0 != self.config {
            self.config = next.0;
            self.generation += 1;
        }
        self.use_sim_time = next.1;
    }

    /// `SetParameters`: each parameter accepted or refused on its own, as rclcpp does, but
    /// whatever their order: a parameter refused only because of one set later in the same
    /// request (`conv.kernel: custom` before its `conv.weights`) is tried again after the
    /// others, until nothing changes, and the ones still refused are tried once more all
    /// together (`conv.size` and `conv.weights` that only fit each other). One result per
    /// parameter, in request order.
    pub(crate) fn set(
        &mut self,
        changes: &[Change],
    ) -> Vec<std::result::Result<ParameterValue, String>> {
        let mut results: Vec<Option<std::result::Result<ParameterValue, String>>> =
            vec![None; changes.len()];
        loop {
            let mut progressed = false;
            for (i, (name, value)) in changes.iter().enumerate() {
                if matches!(results[i], Some(Ok(_))) {
                    continue;
                }
                let base = (self.config.clone(), self.use_sim_time);
                match self.with(&base, name, value) {
                    Ok((next, typed)) => {
                        self.commit(next);
                        results[i] = Some(Ok(typed));
                        progressed = true;
                    }
                    Err(reason) => results[i] = Some(Err(reason)),
                }
            }
            if !progressed || results.iter().all(|r| matches!(r, Some(Ok(_)))) {
                break;
            }
        }
        // Parameters that only fit together (conv.size and conv.weights of a custom
        // kernel): the refused ones, as one atomic change.
        let refused: Vec<usize> =
            (0..changes.len()).filter(|&i| !matches!(results[i], Some(Ok(_)))).collect();
        if refused.len() > 1 {
            let group: Vec<Change> = refused.iter().map(|&i| changes[i].clone()).collect();
            if let Ok(values) = self.set_atomically(&group) {
                for (&i, v) in refused.iter().zip(values) {
                    results[i] = Some(Ok(v));
                }
            }
        }
        results.into_iter().map(|r| r.unwrap_or_else(|| Err("not processed".into()))).collect()
    }

    /// `SetParametersAtomically`: all of them or none; the configuration is checked once,
    /// with every change applied.
    pub(crate) fn set_atomically(
        &mut self,
        changes: &[Change],
    ) -> std::result::Result<Vec<ParameterValue>, String> {
        let mut next = (self.config.clone(), self.use_sim_time);
        let mut typed = Vec::new();
        // Each value on its own first (type, range), then the whole.
        for (name, value) in changes {
            let Some(s) = spec_of(name) else {
                return Err(self.with(&next, name, value).err().unwrap_or_default());
            };
            if (s.read_only && !self.unconfigured) || matches!(value, ParameterValue::NotSet) {
                return Err(self.with(&next, name, value).err().unwrap_or_default());
            }
            let v = coerce(s, value, false).map_err(|e| e.to_string())?;
            if s.name == USE_SIM_TIME.name {
                next.1 = matches!(v, ParameterValue::Bool(true));
            }
            typed.push(v);
        }
        let mut doc = config_doc(&next.0);
        for ((name, _), v) in changes.iter().zip(&typed) {
            if name != USE_SIM_TIME.name {
                config::set_value(&mut doc, name, yaml_of(v)).map_err(|e| e.to_string())?;
            }
        }
        next.0 = Config::from_yaml_value(doc, "parameters").map_err(|e| e.to_string())?;
        self.commit(next);
        Ok(typed)
    }

    /// `ListParameters`, as rclcpp answers it (names sorted; `depth` counts dots below a
    /// prefix; 0 = unlimited).
    pub(crate) fn list(prefixes: &[String], depth: u64) -> ListParametersResult {
        let dots_below = |s: &str| (s.matches('.').count() as u64) < depth;
        let recursive = prefixes.is_empty() && depth == 0;
        let mut result = ListParametersResult::default();
        for name in all_names() {
            if !recursive {
                let all = prefixes.is_empty() && dots_below(name);
                let by_prefix = prefixes.iter().any(|p| {
                    name == p
                        || name
                            .strip_prefix(p.as_str())
                            .and_then(|rest| rest.strip_prefix('.'))
                            .is_some_and(|rest| depth == 0 || dots_below(rest))
                });
                if !all && !by_prefix {
                    continue;
                }
            }
            result.names.push(name.to_string());
            if let Some((prefix, _)) = name.rsplit_once('.') {
                if !result.prefixes.iter().any(|p| p == prefix) {
                    result.prefixes.push(prefix.to_string());
                }
            }
        }
        result
    }
}

/// Every parameter name, sorted (as rclcpp lists them).
pub(super) fn all_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> =
        PARAMETERS.iter().chain([&USE_SIM_TIME]).map(|s| s.name).collect();
    names.sort_unstable();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set1(
        p: &mut NodeParams,
        name: &str,
        v: ParameterValue,
    ) -> std::result::Result<ParameterValue, String> {
        p.set(&[(name.to_string(), v)]).remove(0)
    }

    #[test]
    fn the_table_lists_exactly_the_config_fields_with_their_types() {
        let table: Vec<&str> = PARAMETERS.iter().map(|p| p.name).collect();
        assert_eq!(
            config::parameter_names(),
            table,
            "PARAMETERS must follow Config's fields, in order"
        );
        // Round trip: typed values of the defaults rebuild the defaults.
        let values: Vec<(&str, ParameterValue)> =
            PARAMETERS.iter().map(|s| (s.name, value_of(&Config::default(), s))).collect();
        let (p, unknown) = NodeParams::from_overrides(values.iter().map(|(n, v)| (*n, v))).unwrap();
        assert_eq!((p.config, unknown), (Config::default(), vec![]));
        assert_eq!(
            NodeParams::new(Config::default()).get("roi"),
            Some(ParameterValue::IntegerArray(vec![]))
        );
        assert_eq!(
            NodeParams::new(Config::default()).get("conv.kernel"),
            Some(ParameterValue::String("none".into()))
        );
        assert_eq!(
            NodeParams::new(Config::default()).get("use_sim_time"),
            Some(ParameterValue::Bool(false))
        );
    }

    /// The "one of:" lists are the values serde accepts, no more, no fewer.
    #[test]
    fn string_constraints_list_exactly_the_accepted_values() {
        for s in PARAMETERS
            .iter()
            .filter(|s| s.kind == Kind::Str && s.constraints.starts_with("one of: "))
        {
            let mut listed: Vec<&str> = s.constraints["one of: ".len()..]
                .split(';')
                .next()
                .unwrap_or("")
                .split(", ")
                .collect();
            let e = Config::from_params([(s.name.to_string(), Value::String("__x__".into()))], "t")
                .unwrap_err()
                .to_string();
            // serde: "expected `a` or `b`" / "expected one of `a`, `b`, `c`".
            let tail = e.split("expected ").nth(1).unwrap_or_else(|| panic!("{}: {e}", s.name));
            let mut accepted: Vec<&str> = tail
                .trim_start_matches("one of ")
                .split([',', ' '])
                .filter(|v| v.starts_with('`'))
                .map(|v| v.trim_matches('`'))
                // `auto` is a QoS choice of the input only: the type has it, output_qos
                // refuses it (Config::validate), so its descriptor does not list it.
                .filter(|v| !(s.name == "output_qos" && *v == "auto"))
                .collect();
            // output_qos parses as the input's QoS type, but validation refuses `auto`
            // (only input_qos takes it), so it is not listed.
            if s.name == "output_qos" {
                let auto = [(s.name.to_string(), Value::String("auto".into()))];
                assert!(Config::from_params(auto, "t").is_err());
                accepted.retain(|v| *v != "auto");
            }
            listed.sort_unstable();
            accepted.sort_unstable();
            assert_eq!(listed, accepted, "{}", s.name);
        }
    }

    #[test]
    fn descriptors_carry_ranges_read_only_and_constraints() {
        let d = descriptor(spec_of("network_image_width").unwrap());
        assert_eq!(d.type_, T::PARAMETER_INTEGER as u8);
        assert_eq!(
            (d.integer_range[0].from_value, d.integer_range[0].to_value, d.integer_range[0].step),
            (1, 8192, 1)
        );
        assert!(!d.read_only && d.floating_point_range.is_empty());
        let d = descriptor(spec_of("conv.size").unwrap());
        assert_eq!(
            (d.integer_range[0].from_value, d.integer_range[0].to_value, d.integer_range[0].step),
            (1, 15, 2)
        );
        let d = descriptor(spec_of("pad_value").unwrap());
        assert_eq!(
            (d.floating_point_range[0].from_value, d.floating_point_range[0].to_value),
            (0.0, 255.0)
        );
        for name in [
            "backend",
            "device_id",
            "memory_mode",
            "gpu_failure_policy",
            "input_qos",
            "input_qos_depth",
            "output_qos",
            "output_qos_depth",
            "inputs",
            "input_frame_ids",
            "camera_info_urls",
            "image_transport",
            "input_transports",
            "video_decoder",
            "batch_policy",
            "batch_timeout_ms",
            "max_interval_ms",
            "stale_after_ms",
            "batch_queue_size",
            "input_participants",
        ] {
            let d = descriptor(spec_of(name).unwrap());
            assert!(d.read_only && d.additional_constraints.contains("read-only"), "{name}");
        }
        let read_only: Vec<&str> =
            PARAMETERS.iter().filter(|s| s.read_only).map(|s| s.name).collect();
        assert_eq!(read_only.len(), 22, "{read_only:?}");
    }

    #[test]
    fn dotted_typed_and_unknown_start_up_parameters() {
        let p = [
            ("network_image_width", ParameterValue::Integer(320)),
            ("conv.kernel", ParameterValue::String("none".into())),
            ("image_mean", ParameterValue::DoubleArray(vec![0.485, 0.456, 0.406])),
            ("pad_value", ParameterValue::IntegerArray(vec![114, 114, 114])),
            ("pixel_scale", ParameterValue::Integer(1)),
            ("use_sim_time", ParameterValue::Bool(true)),
            ("roi", ParameterValue::NotSet),
            ("network_width", ParameterValue::Integer(3)),
            ("qos_overrides./tensor.publisher.depth", ParameterValue::Integer(3)),
        ];
        let (np, unknown) = NodeParams::from_overrides(p.iter().map(|(n, v)| (*n, v))).unwrap();
        assert_eq!(np.config.network_image_width, 320);
        assert_eq!(np.config.pad_value, vec![114.0, 114.0, 114.0]);
        assert_eq!(np.config.pixel_scale, 1.0);
        assert!(np.use_sim_time);
        assert_eq!(
            unknown.iter().map(|u| u.to_string()).collect::<Vec<_>>(),
            ["`network_width` is not a parameter of vision_preproc (ignored); did you mean `network_image_width`?"]
        );
        let e = |p: &[(&str, ParameterValue)]| {
            NodeParams::from_overrides(p.iter().map(|(n, v)| (*n, v))).unwrap_err().to_string()
        };
        assert_eq!(
            e(&[("network_image_width", ParameterValue::Integer(-3))]),
            "network_image_width must be in [1, 8192] (got -3)"
        );
        assert_eq!(
            e(&[("pixel_scale", ParameterValue::String("x".into()))]),
            "parameter pixel_scale is of type double; setting it to string is not allowed"
        );
        assert_eq!(
            e(&[("use_sim_time", ParameterValue::Integer(1))]),
            "parameter use_sim_time is of type boolean; setting it to integer is not allowed"
        );
        let out = e(&[("output_layout", ParameterValue::String("CHW".into()))]);
        assert!(out.contains("output_layout") && out.contains("CHW"), "{out}");
    }

    #[test]
    fn run_time_changes_are_validated_in_ros_words() {
        let mut p = NodeParams::new(Config::default());
        set1(&mut p, "image_mean", ParameterValue::DoubleArray(vec![0.1, 0.2, 0.3])).unwrap();
        assert_eq!((p.generation, p.config.image_mean.clone()), (1, vec![0.1, 0.2, 0.3]));
        // Same value again: accepted, no new generation.
        set1(&mut p, "image_mean", ParameterValue::DoubleArray(vec![0.1, 0.2, 0.3])).unwrap();
        assert_eq!(p.generation, 1);
        let r = |p: &mut NodeParams, n: &str, v| set1(p, n, v).unwrap_err();
        assert_eq!(
            r(&mut p, "network_image_width", ParameterValue::Integer(0)),
            "network_image_width must be in [1, 8192] (got 0)"
        );
        // conv.size is refused when invalid whatever conv.kernel is.
        assert_eq!(
            r(&mut p, "conv.size", ParameterValue::Integer(4)),
            "conv.size must be in [1, 15] with step 2 (got 4)"
        );
        set1(&mut p, "conv.kernel", ParameterValue::String("box".into())).unwrap();
        assert_eq!(
            r(&mut p, "conv.size", ParameterValue::Integer(4)),
            "conv.size must be in [1, 15] with step 2 (got 4)"
        );
        assert_eq!((p.config.conv.size, p.generation), (3, 2));
        assert_eq!(
            r(&mut p, "backend", ParameterValue::String("cpu".into())),
            "parameter 'backend' cannot be set because it is read-only (start-up only: restart the node with the new value)"
        );
        assert_eq!(
            r(&mut p, "pixel_scale", ParameterValue::String("x".into())),
            "parameter pixel_scale is of type double; setting it to string is not allowed"
        );
        assert_eq!(
            r(&mut p, "tensor_name", ParameterValue::NotSet),
            "parameter 'tensor_name' cannot be undeclared (deleted): it is statically typed (string); set a value instead"
        );
        assert_eq!(
            r(&mut p, "network_width", ParameterValue::Integer(3)),
            "parameter 'network_width' is not declared by vision_preproc; did you mean 'network_image_width'?"
        );
        // An integer for a double is taken and stored as the double.
        assert_eq!(
            set1(&mut p, "debug_image_rate", ParameterValue::Integer(5)),
            Ok(ParameterValue::Double(5.0))
        );
        assert_eq!(p.get("debug_image_rate"), Some(ParameterValue::Double(5.0)));
        assert_eq!(p.generation, 3);
        assert_eq!(
            set1(&mut p, "use_sim_time", ParameterValue::Bool(true)),
            Ok(ParameterValue::Bool(true))
        );
        assert!(p.use_sim_time && p.generation == 3);
    }

    /// Rules between parameters are checked on the resulting configuration: in one
    /// request, in any order; in separate requests, the refusal says what conflicts.
    #[test]
    fn cross_parameter_rules_in_both_orders() {
        let weights = ParameterValue::DoubleArray(vec![1.0 / 25.0; 25]);
        let custom5 = [
            ("conv.kernel".to_string(), ParameterValue::String("custom".into())),
            ("conv.size".to_string(), ParameterValue::Integer(5)),
            ("conv.weights".to_string(), weights.clone()),
        ];
        for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2], [0, 2, 1]] {
            let mut p = NodeParams::new(Config::default());
            let changes: Vec<Change> = order.iter().map(|&i| custom5[i].clone()).collect();
            let results = p.set(&changes);
            assert!(results.iter().all(|r| r.is_ok()), "{order:?}: {results:?}");
            assert_eq!((p.config.conv.kernel, p.config.conv.size), (config::ConvKernel::Custom, 5));
            let mut q = NodeParams::new(Config::default());
            q.set_atomically(&changes).unwrap();
            assert_eq!(q.config, p.config);
        }
        // One at a time: the first that breaks the rule is refused, naming both.
        let mut p = NodeParams::new(Config::default());
        let e = set1(&mut p, "conv.kernel", ParameterValue::String("custom".into())).unwrap_err();
        assert!(e.starts_with("conv.kernel = \"custom\" conflicts with the other parameters: parameter `conv.weights`: 0 values is invalid; conv.kernel custom with conv.size 3 needs"), "{e}");
        // Weights first (valid while the kernel is not custom), then the kernel: accepted.
        set1(&mut p, "conv.weights", ParameterValue::DoubleArray(vec![0.0; 9])).unwrap();
        set1(&mut p, "conv.kernel", ParameterValue::String("custom".into())).unwrap();
        // Now conv.size alone cannot change (9 weights), neither order works alone ...
        assert!(set1(&mut p, "conv.size", ParameterValue::Integer(5))
            .unwrap_err()
            .contains("conflicts"));
        assert!(set1(&mut p, "conv.weights", weights.clone())
            .unwrap_err()
            .contains("set conv.size and conv.weights together"));
        // ... and atomically both do; a bad atomic request changes nothing.
        let gen = p.generation;
        assert!(p
            .set_atomically(&[
                ("conv.size".into(), ParameterValue::Integer(7)),
                ("conv.weights".into(), weights.clone())
            ])
            .is_err());
        assert_eq!(p.generation, gen);
        p.set_atomically(&[
            ("conv.weights".into(), weights),
            ("conv.size".into(), ParameterValue::Integer(5)),
        ])
        .unwrap();
        assert_eq!(p.config.conv.size, 5);
        // ... and in one SetParameters request, in either order.
        for order in [false, true] {
            let mut q = p.clone();
            let mut ch = vec![
                ("conv.size".to_string(), ParameterValue::Integer(7)),
                ("conv.weights".to_string(), ParameterValue::DoubleArray(vec![0.0; 49])),
            ];
            if order {
                ch.reverse();
            }
            assert!(q.set(&ch).iter().all(|r| r.is_ok()));
            assert_eq!((q.config.conv.size, q.config.conv.weights.len()), (7, 49));
        }
        // A refused group stays refused, each with its reason.
        let r = p.clone().set(&[
            ("conv.size".to_string(), ParameterValue::Integer(7)),
            ("conv.weights".to_string(), ParameterValue::DoubleArray(vec![0.0; 48])),
        ]);
        assert!(r.iter().all(|r| r.is_err()), "{r:?}");
        // output_channels vs image_mean, both orders in one request.
        for rev in [false, true] {
            let mut p = NodeParams::new(Config::default());
            let mut ch = vec![
                ("output_channels".to_string(), ParameterValue::Integer(1)),
                ("image_mean".to_string(), ParameterValue::DoubleArray(vec![0.5])),
                ("image_stddev".to_string(), ParameterValue::DoubleArray(vec![0.25])),
            ];
            if rev {
                ch.reverse();
            }
            assert!(p.set(&ch).iter().all(|r| r.is_ok()));
            assert_eq!(p.config.output_channels, 1);
        }
    }

    #[test]
    fn read_only_parameters_are_settable_while_unconfigured_only() {
        let mut p = NodeParams::new(Config::default());
        let cpu = || ParameterValue::String("cpu".into());
        assert!(set1(&mut p, "backend", cpu()).unwrap_err().contains("read-only"));
        assert!(p.set_atomically(&[("backend".into(), cpu())]).is_err());
        p.unconfigured = true;
        assert!(set1(&mut p, "backend", cpu()).is_ok());
        assert!(matches!(p.get("backend"), Some(ParameterValue::String(b)) if b == "cpu"));
        assert!(p
            .set_atomically(&[("shared_pool_size".into(), ParameterValue::Integer(0))])
            .is_ok());
        assert_eq!(p.config.shared_pool_size, 0);
        // Ranges still hold.
        assert!(set1(&mut p, "shared_pool_size", ParameterValue::Integer(65)).is_err());
    }

    #[test]
    fn list_follows_rclcpp() {
        let all = NodeParams::list(&[], 0);
        assert_eq!(all.names.len(), PARAMETERS.len() + 1);
        assert!(all.names.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(all.prefixes, ["conv"]);
        let top = NodeParams::list(&[], 1);
        assert!(
            !top.names.iter().any(|n| n.contains('.'))
                && top.names.contains(&"backend".to_string())
        );
        let conv = NodeParams::list(&["conv".into()], 0);
        assert_eq!(
            conv.names,
            ["conv.border", "conv.kernel", "conv.sigma", "conv.size", "conv.weights"]
        );
    }
}
