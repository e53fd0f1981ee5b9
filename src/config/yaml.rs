//! Reading parameters: YAML files in the ROS shape, `--set` overrides, the node's
//! parameters; unknown names are warned about with the closest known one.

use super::*;
use crate::error::{Error, Result};
use std::path::Path;

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
