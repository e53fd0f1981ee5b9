//! Parameter values: r2r's values <-> `rcl_interfaces` messages, as logged, checked
//! against a parameter's type, and as YAML for the configuration.

use super::specs::{Kind, Range, Spec};
use crate::error::{Error, Result};
use r2r::rcl_interfaces::msg::{ParameterType as T, ParameterValue as ValueMsg};
use r2r::ParameterValue;
use serde_yaml::Value;

/// A `rcl_interfaces/ParameterValue` as r2r's value (an unknown type is "not set").
pub(in crate::ros::node) fn value_from_msg(m: &ValueMsg) -> ParameterValue {
    match i32::from(m.type_) {
        x if x == T::PARAMETER_BOOL as i32 => ParameterValue::Bool(m.bool_value),
        x if x == T::PARAMETER_INTEGER as i32 => ParameterValue::Integer(m.integer_value),
        x if x == T::PARAMETER_DOUBLE as i32 => ParameterValue::Double(m.double_value),
        x if x == T::PARAMETER_STRING as i32 => ParameterValue::String(m.string_value.clone()),
        x if x == T::PARAMETER_BYTE_ARRAY as i32 => {
            ParameterValue::ByteArray(m.byte_array_value.clone())
        }
        x if x == T::PARAMETER_BOOL_ARRAY as i32 => {
            ParameterValue::BoolArray(m.bool_array_value.clone())
        }
        x if x == T::PARAMETER_INTEGER_ARRAY as i32 => {
            ParameterValue::IntegerArray(m.integer_array_value.clone())
        }
        x if x == T::PARAMETER_DOUBLE_ARRAY as i32 => {
            ParameterValue::DoubleArray(m.double_array_value.clone())
        }
        x if x == T::PARAMETER_STRING_ARRAY as i32 => {
            ParameterValue::StringArray(m.string_array_value.clone())
        }
        _ => ParameterValue::NotSet,
    }
}

/// r2r's value as a `rcl_interfaces/ParameterValue`.
pub(in crate::ros::node) fn value_to_msg(v: &ParameterValue) -> ValueMsg {
    let mut m = ValueMsg::default();
    // Set field `$f` of the message to `$x`; the type is `$t`.
    macro_rules! set {
        ($f:ident, $x:expr, $t:ident) => {{
            m.$f = $x.clone();
            T::$t as u8
        }};
    }
    m.type_ = match v {
        ParameterValue::NotSet => T::PARAMETER_NOT_SET as u8,
        ParameterValue::Bool(x) => set!(bool_value, x, PARAMETER_BOOL),
        ParameterValue::Integer(x) => set!(integer_value, x, PARAMETER_INTEGER),
        ParameterValue::Double(x) => set!(double_value, x, PARAMETER_DOUBLE),
        ParameterValue::String(x) => set!(string_value, x, PARAMETER_STRING),
        ParameterValue::ByteArray(x) => set!(byte_array_value, x, PARAMETER_BYTE_ARRAY),
        ParameterValue::BoolArray(x) => set!(bool_array_value, x, PARAMETER_BOOL_ARRAY),
        ParameterValue::IntegerArray(x) => set!(integer_array_value, x, PARAMETER_INTEGER_ARRAY),
        ParameterValue::DoubleArray(x) => set!(double_array_value, x, PARAMETER_DOUBLE_ARRAY),
        ParameterValue::StringArray(x) => set!(string_array_value, x, PARAMETER_STRING_ARRAY),
    };
    m
}

/// A value as a log line shows it: doubles always with a decimal point (`5.0`), strings
/// quoted.
pub(in crate::ros::node) fn show(v: &ParameterValue) -> String {
    let list = |items: Vec<String>| format!("[{}]", items.join(", "));
    match v {
        ParameterValue::NotSet => "not set".into(),
        ParameterValue::Bool(b) => b.to_string(),
        ParameterValue::Integer(i) => i.to_string(),
        ParameterValue::Double(d) => format!("{d:?}"),
        ParameterValue::String(s) => format!("{s:?}"),
        ParameterValue::ByteArray(a) => list(a.iter().map(|x| x.to_string()).collect()),
        ParameterValue::BoolArray(a) => list(a.iter().map(|x| x.to_string()).collect()),
        ParameterValue::IntegerArray(a) => list(a.iter().map(|x| x.to_string()).collect()),
        ParameterValue::DoubleArray(a) => list(a.iter().map(|x| format!("{x:?}")).collect()),
        ParameterValue::StringArray(a) => list(a.iter().map(|x| format!("{x:?}")).collect()),
    }
}

/// The ROS type name of a value, as `ros2 param` prints it.
pub(super) fn type_name(v: &ParameterValue) -> &'static str {
    match v {
        ParameterValue::NotSet => "not set",
        ParameterValue::Bool(_) => "boolean",
        ParameterValue::Integer(_) => "integer",
        ParameterValue::Double(_) => "double",
        ParameterValue::String(_) => "string",
        ParameterValue::ByteArray(_) => "byte array",
        ParameterValue::BoolArray(_) => "boolean array",
        ParameterValue::IntegerArray(_) => "integer array",
        ParameterValue::DoubleArray(_) => "double array",
        ParameterValue::StringArray(_) => "string array",
    }
}

/// `v` as a value of `s`'s type: integers for doubles are converted (see the module
/// comment); at start-up, "not set" for an array is `[]` (rcl's YAML parser cannot type
/// an empty array, so `roi: []` in a file arrives that way). Then the integer range.
pub(super) fn coerce(s: &Spec, v: &ParameterValue, at_startup: bool) -> Result<ParameterValue> {
    use ParameterValue as V;
    let typed = match (s.kind, v) {
        (Kind::Bool, V::Bool(_))
        | (Kind::Integer, V::Integer(_))
        | (Kind::Double, V::Double(_))
        | (Kind::Str, V::String(_))
        | (Kind::IntegerArray, V::IntegerArray(_))
        | (Kind::DoubleArray, V::DoubleArray(_))
        | (Kind::StrArray, V::StringArray(_)) => v.clone(),
        (Kind::Double, V::Integer(i)) => V::Double(*i as f64),
        (Kind::DoubleArray, V::IntegerArray(a)) => {
            V::DoubleArray(a.iter().map(|i| *i as f64).collect())
        }
        (Kind::IntegerArray, V::NotSet) if at_startup => V::IntegerArray(vec![]),
        (Kind::DoubleArray, V::NotSet) if at_startup => V::DoubleArray(vec![]),
        (Kind::StrArray, V::NotSet) if at_startup => V::StringArray(vec![]),
        _ => {
            return Err(Error::ParameterType {
                param: s.name.to_string(),
                expected: s.kind.name().to_string(),
                got: type_name(v).to_string(),
            })
        }
    };
    if let (Range::Int(r), V::Integer(i)) = (s.range, &typed) {
        r.check(s.name, *i)?;
    }
    Ok(typed)
}

pub(super) fn yaml_of(v: &ParameterValue) -> Value {
    let seq = |it: Vec<Value>| Value::Sequence(it);
    match v {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_convert_to_messages_and_back_and_show_doubles_as_doubles() {
        for v in [
            ParameterValue::Bool(true),
            ParameterValue::Integer(-3),
            ParameterValue::Double(5.0),
            ParameterValue::String("box".into()),
            ParameterValue::IntegerArray(vec![1, 2]),
            ParameterValue::DoubleArray(vec![0.5]),
            ParameterValue::NotSet,
        ] {
            assert_eq!(value_from_msg(&value_to_msg(&v)), v);
        }
        assert_eq!(show(&ParameterValue::Double(5.0)), "5.0");
        assert_eq!(show(&ParameterValue::DoubleArray(vec![114.0, 0.5])), "[114.0, 0.5]");
    }
}
