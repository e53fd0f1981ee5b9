//! ROS parameters <-> [`Config`]: the node's parameters are the fields of `Config`
//! (nested ones dotted, e.g. `conv.kernel`), converted through a YAML value so that serde
//! does the typing and names the parameter in errors.

use crate::config::Config;
use crate::error::{Error, Result};
use r2r::ParameterValue;
use serde_yaml::{Mapping, Value};

/// Parameters every node has that are not ours.
fn is_foreign(name: &str) -> bool {
    name == "use_sim_time" || name.starts_with("qos_overrides.")
}

/// Build a validated configuration from the defaults overlaid with `params` (from
/// `--params-file`, `-p name:=value`, or `ros2 param set`).
pub fn config_from_params<'a>(
    params: impl IntoIterator<Item = (&'a str, &'a ParameterValue)>,
) -> Result<Config> {
    let mut doc = serde_yaml::to_value(Config::default())
        .map_err(|e| Error::config("(defaults)", e, "report this as a bug"))?;
    for (name, value) in params {
        if is_foreign(name) {
            continue;
        }
        insert_dotted(&mut doc, name, yaml_of(value))?;
    }
    Config::from_yaml_value(doc, "ROS parameters")
}

fn yaml_of(v: &ParameterValue) -> Value {
    match v {
        // rcl's YAML parser gives an empty array (`roi: []`) no type: it arrives as "not
        // set". Every parameter that can be empty is an array, so read it as `[]`.
        ParameterValue::NotSet => Value::Sequence(Vec::new()),
        ParameterValue::Bool(b) => Value::Bool(*b),
        ParameterValue::Integer(i) => Value::Number((*i).into()),
        ParameterValue::Double(d) => Value::Number((*d).into()),
        ParameterValue::String(s) => Value::String(s.clone()),
        ParameterValue::BoolArray(a) => {
            Value::Sequence(a.iter().map(|b| Value::Bool(*b)).collect())
        }
        ParameterValue::ByteArray(a) => {
            Value::Sequence(a.iter().map(|b| Value::Number((*b).into())).collect())
        }
        ParameterValue::IntegerArray(a) => {
            Value::Sequence(a.iter().map(|i| Value::Number((*i).into())).collect())
        }
        ParameterValue::DoubleArray(a) => {
            Value::Sequence(a.iter().map(|d| Value::Number((*d).into())).collect())
        }
        ParameterValue::StringArray(a) => {
            Value::Sequence(a.iter().map(|s| Value::String(s.clone())).collect())
        }
    }
}

fn insert_dotted(doc: &mut Value, name: &str, v: Value) -> Result<()> {
    let mut node = doc;
    let mut parts = name.split('.').peekable();
    while let Some(part) = parts.next() {
        let map: &mut Mapping = node.as_mapping_mut().ok_or_else(|| {
            Error::config(name, "(nested)", "this parameter has no sub-parameters")
        })?;
        if parts.peek().is_none() {
            map.insert(Value::String(part.to_string()), v);
            return Ok(());
        }
        node = map
            .entry(Value::String(part.to_string()))
            .or_insert_with(|| Value::Mapping(Mapping::new()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
