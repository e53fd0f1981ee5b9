//! r2r native (C) messages read in place, and the ROS command line read with rcl before
//! the node exists.
//!
//! `subscribe_native` hands over the C message rmw deserialized into: the pixel bytes
//! are read where rmw put them (no copy into a Rust `Image`). The command line is parsed
//! by rcl itself (`rcl_parse_arguments`, what `rcl_init` does with the same `argv`): for
//! the remapped name of the input topic (rclcpp's `get_publishers_info_by_topic` expands
//! and remaps the same way) and for the node's parameters, read once before the node's
//! DDS participant is created (its Fast DDS segment is sized from them).

use crate::image::ImageView;
use crate::wire::msgs::Header;
use r2r::sensor_msgs::msg::{CompressedImage, Image};
use r2r::{ParameterValue, WrappedTypesupport};
use r2r_rcl as rcl;
use std::ffi::{c_char, CStr, CString};

/// A received message (`sensor_msgs/Image` or `CompressedImage`): the C message rmw
/// deserialized into, owned.
pub(super) struct Native<T: WrappedTypesupport + 'static>(r2r::NativeMsg<T>);

/// A received raw image.
pub(super) type NativeImage = Native<Image>;
/// A received compressed image.
pub(super) type NativeCompressed = Native<CompressedImage>;

// SAFETY: the wrapped C message is heap memory created by the type support
// (`create_msg`) and freed by its `destroy_msg` (the default allocator: malloc/free,
// thread-safe), owned by this value alone, with no thread affinity. Loaned messages,
// whose release goes back to the subscription, are never wrapped (see `new`).
unsafe impl<T: WrappedTypesupport + 'static> Send for Native<T> {}

// SAFETY: shared references only read the message (every method takes `&self` and never
// writes through the C pointers); nothing is mutated after `new`, so reads from several
// threads at once (a batch held by the spin thread and the processing thread) are
// data-race free.
unsafe impl<T: WrappedTypesupport + 'static> Sync for Native<T> {}

impl<T: WrappedTypesupport + 'static> Native<T> {
    /// Take ownership of a received message. A loaned one (Fast DDS loans only plain
    /// types, which images are not, so this does not happen with them) is copied into
    /// an owned message first, and its loan is returned here, on the subscription's
    /// thread.
    pub(super) fn new(msg: r2r::NativeMsg<T>) -> Self {
        if !msg.is_loaned {
            return Native(msg);
        }
        Native(r2r::NativeMsg::from(&T::from_native(&msg)))
    }
}

/// The accessors both image messages have (`data`, `header`).
macro_rules! common_accessors {
    ($msg:ty) => {
        impl Native<$msg> {
            /// The payload bytes (pixels, or compressed data), in place.
            pub(super) fn data(&self) -> &[u8] {
                let d = &self.0.data;
                if d.data.is_null() || d.size == 0 {
                    return &[];
                }
                // SAFETY: a rosidl sequence holds `size` initialized elements at `data`,
                // owned by the message, which lives as long as `self` (the borrow ties
                // them).
                unsafe { std::slice::from_raw_parts(d.data, d.size) }
            }

            /// The header, as the ROS-free type of the output messages.
            pub(super) fn header(&self) -> Header {
                let h = &self.0.header;
                Header {
                    sec: h.stamp.sec,
                    nanosec: h.stamp.nanosec,
                    frame_id: String::from_utf8_lossy(c_string(&h.frame_id)).into_owned(),
                }
            }
        }
    };
}
common_accessors!(Image);
common_accessors!(CompressedImage);

impl Native<Image> {
    /// `encoding` (an encoding that is not UTF-8 reads as one that no table knows, and
    /// is rejected by name).
    pub(super) fn encoding(&self) -> &str {
        std::str::from_utf8(c_string(&self.0.encoding)).unwrap_or("<not UTF-8>")
    }

    /// The image, validated (step, size, encoding), borrowing the pixel bytes.
    pub(super) fn view(&self) -> Result<ImageView<'_>, crate::ImageError> {
        let m = &*self.0;
        ImageView::new(m.width, m.height, m.step, self.encoding(), m.is_bigendian != 0, self.data())
    }
}

impl Native<CompressedImage> {
    /// `format` (`jpeg`, `bgr8; jpeg compressed bgr8`, ...; not UTF-8 reads as a format
    /// no one knows, and is rejected by name).
    pub(super) fn format(&self) -> &str {
        std::str::from_utf8(c_string(&self.0.format)).unwrap_or("<not UTF-8>")
    }
}

/// The bytes of a rosidl string (without its NUL).
fn c_string(s: &rcl::rosidl_runtime_c__String) -> &[u8] {
    if s.data.is_null() || s.size == 0 {
        return &[];
    }
    // SAFETY: a rosidl string holds `size` bytes at `data` (plus a NUL), owned by the
    // message the borrow of `s` comes from.
    unsafe { std::slice::from_raw_parts(s.data.cast::<u8>(), s.size) }
}

/// An r2r header from the ROS-free one.
pub(super) fn ros_header(h: &Header) -> r2r::std_msgs::msg::Header {
    r2r::std_msgs::msg::Header {
        stamp: r2r::builtin_interfaces::msg::Time { sec: h.sec, nanosec: h.nanosec },
        frame_id: h.frame_id.clone(),
    }
}

extern "C" {
    // rcl/remap.h (librcl, linked through r2r_rcl; not in its generated bindings).
    fn rcl_remap_topic_name(
        local_arguments: *const rcl::rcl_arguments_t,
        global_arguments: *const rcl::rcl_arguments_t,
        topic_name: *const c_char,
        node_name: *const c_char,
        node_namespace: *const c_char,
        allocator: rcl::rcl_allocator_t,
        output_name: *mut *mut c_char,
    ) -> rcl::rcl_ret_t;
    fn rcl_remap_node_name(
        local_arguments: *const rcl::rcl_arguments_t,
        global_arguments: *const rcl::rcl_arguments_t,
        node_name: *const c_char,
        allocator: rcl::rcl_allocator_t,
        output_name: *mut *mut c_char,
    ) -> rcl::rcl_ret_t;
    fn rcl_remap_node_namespace(
        local_arguments: *const rcl::rcl_arguments_t,
        global_arguments: *const rcl::rcl_arguments_t,
        node_name: *const c_char,
        allocator: rcl::rcl_allocator_t,
        output_namespace: *mut *mut c_char,
    ) -> rcl::rcl_ret_t;
}

/// A parameter value as rcl parsed it (one of its pointers is set), as r2r reads it.
///
/// # Safety
/// `v` comes from an `rcl_params_t` that is alive: each non-null pointer points to a
/// value (an array: `size` elements at `values`/`data`, or none when that is null;
/// strings NUL-terminated).
unsafe fn parameter_value(v: &rcl::rcl_variant_t) -> ParameterValue {
    unsafe fn array<T: Clone>(values: *const T, size: usize) -> Vec<T> {
        if values.is_null() {
            return Vec::new();
        }
        // SAFETY: the caller's contract: `size` elements at `values`.
        unsafe { std::slice::from_raw_parts(values, size) }.to_vec()
    }
    // An array value `$p` (non-null: a live rcl array of `size` elements, or none when
    // `values` is null) as `$variant`; used inside the unsafe block below.
    macro_rules! array_value {
        ($p:expr, $variant:ident) => {{
            let a = &*$p;
            ParameterValue::$variant(array(a.values, a.size))
        }};
    }
    // SAFETY: (each arm) the pointer is non-null, so it points to a live value of its
    // type (the function's contract).
    unsafe {
        if !v.bool_value.is_null() {
            ParameterValue::Bool(*v.bool_value)
        } else if !v.integer_value.is_null() {
            ParameterValue::Integer(*v.integer_value)
        } else if !v.double_value.is_null() {
            ParameterValue::Double(*v.double_value)
        } else if !v.string_value.is_null() {
            ParameterValue::String(CStr::from_ptr(v.string_value).to_string_lossy().into_owned())
        } else if !v.byte_array_value.is_null() {
            array_value!(v.byte_array_value, ByteArray)
        } else if !v.bool_array_value.is_null() {
            array_value!(v.bool_array_value, BoolArray)
        } else if !v.integer_array_value.is_null() {
            array_value!(v.integer_array_value, IntegerArray)
        } else if !v.double_array_value.is_null() {
            array_value!(v.double_array_value, DoubleArray)
        } else if !v.string_array_value.is_null() {
            let a = &*v.string_array_value;
            let strings = array(a.data.cast_const(), a.size);
            let text = |&c: &*mut c_char| {
                if c.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(c).to_string_lossy().into_owned()
                }
            };
            ParameterValue::StringArray(strings.iter().map(text).collect())
        } else {
            ParameterValue::NotSet
        }
    }
}

/// This process's ROS arguments, parsed by rcl.
pub(super) struct RosArgs {
    args: rcl::rcl_arguments_t,
}

// SAFETY: the parsed arguments are heap data owned by this value alone (rcl allocates
// them with the default, thread-safe allocator); they are read by one thread at a time
// (the value is moved, never shared) and finalized once, in `drop`.
unsafe impl Send for RosArgs {}

impl RosArgs {
    /// Parse `std::env::args()` as `rcl_init` does; `None` if rcl refuses them (the
    /// node's own start then reports the error).
    pub(super) fn parse() -> Option<RosArgs> {
        let owned: Vec<CString> = std::env::args().filter_map(|a| CString::new(a).ok()).collect();
        let argv: Vec<*const c_char> = owned.iter().map(|a| a.as_ptr()).collect();
        // SAFETY: plain constructor of a zeroed struct.
        let mut args = unsafe { rcl::rcl_get_zero_initialized_arguments() };
        // SAFETY: argv holds argc valid NUL-terminated strings that outlive the call; the
        // output is zero-initialized as rcl requires; the default allocator is valid.
        let ret = unsafe {
            rcl::rcl_parse_arguments(
                argv.len() as i32,
                argv.as_ptr(),
                rcl::rcutils_get_default_allocator(),
                &mut args,
            )
        };
        if ret != rcl::RCL_RET_OK as i32 {
            // SAFETY: resets rcl's thread-local error state, set by the failed call.
            unsafe { rcl::rcutils_reset_error() };
            return None;
        }
        Some(RosArgs { args })
    }

    /// The fully qualified name of the relative topic `topic` of node `name` in
    /// `namespace`, after this command line's remapping rules (`-r image:=/cam/raw`,
    /// `-r vision_preproc:image:=...`). `None` if rcl cannot say.
    pub(super) fn resolve_topic(&self, topic: &str, name: &str, namespace: &str) -> Option<String> {
        let expanded = if topic.starts_with('/') {
            topic.to_string()
        } else if namespace.ends_with('/') {
            format!("{namespace}{topic}")
        } else {
            format!("{namespace}/{topic}")
        };
        let (t, n, ns) = (
            CString::new(expanded.clone()).ok()?,
            CString::new(name).ok()?,
            CString::new(namespace).ok()?,
        );
        let remapped = self.remapped(|allocator, out| {
            // SAFETY: valid argument struct (parsed above, alive), NUL-terminated strings
            // that outlive the call, a valid out pointer; no local arguments (r2r creates
            // the node with the default options, which have none).
            unsafe {
                rcl_remap_topic_name(
                    std::ptr::null(),
                    &self.args,
                    t.as_ptr(),
                    n.as_ptr(),
                    ns.as_ptr(),
                    allocator,
                    out,
                )
            }
        })?;
        Some(remapped.unwrap_or(expanded))
    }

    /// The node's name after this command line's remapping (`-r __node:=name`), or `name`.
    fn remapped_node_name(&self, name: &str) -> Option<String> {
        let n = CString::new(name).ok()?;
        self.remapped(|allocator, out| {
            // SAFETY: valid argument struct (parsed above, alive), a NUL-terminated
            // string that outlives the call, a valid out pointer; no local arguments.
            unsafe { rcl_remap_node_name(std::ptr::null(), &self.args, n.as_ptr(), allocator, out) }
        })
        .map(|r| r.unwrap_or_else(|| name.to_string()))
    }

    /// The node's namespace after this command line's remapping (`-r __ns:=/robot`), or
    /// `/`.
    fn remapped_namespace(&self, name: &str) -> Option<String> {
        let n = CString::new(name).ok()?;
        self.remapped(|allocator, out| {
            // SAFETY: as in `remapped_node_name`.
            unsafe {
                rcl_remap_node_namespace(std::ptr::null(), &self.args, n.as_ptr(), allocator, out)
            }
        })
        .map(|r| r.unwrap_or_else(|| "/".to_string()))
    }

    /// Run one rcl remap call (`call(allocator, &mut out)`) and take its output string:
    /// `Some(None)` when no rule applies, `None` when rcl fails.
    fn remapped(
        &self,
        call: impl FnOnce(rcl::rcl_allocator_t, *mut *mut c_char) -> rcl::rcl_ret_t,
    ) -> Option<Option<String>> {
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: rcutils_get_default_allocator has no preconditions.
        let allocator = unsafe { rcl::rcutils_get_default_allocator() };
        if call(allocator, &mut out) != rcl::RCL_RET_OK as i32 {
            // SAFETY: as in `parse`.
            unsafe { rcl::rcutils_reset_error() };
            return None;
        }
        if out.is_null() {
            return Some(None);
        }
        // SAFETY: rcl returned a NUL-terminated string allocated with `allocator`; it is
        // copied, then freed once with the same allocator.
        let s = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
        if let Some(free) = allocator.deallocate {
            // SAFETY: see above.
            unsafe { free(out.cast(), allocator.state) };
        }
        Some(Some(s))
    }

    /// The parameters this command line gives (`--params-file`, `-p`) to the node named
    /// `name` (after `__node`/`__ns` remapping): the entries of every section that
    /// matches the node's fully qualified name by rclcpp's rule (`/**`, `/*` wildcards:
    /// [`section_matches`]) or is its bare name, in rcl's order, a later value of a name
    /// replacing an earlier one — what r2r gives the node once it exists, read before
    /// its DDS participant is created.
    pub(super) fn parameter_overrides(&self, name: &str) -> Vec<(String, ParameterValue)> {
        let node = self.remapped_node_name(name).unwrap_or_else(|| name.to_string());
        let namespace = self.remapped_namespace(name).unwrap_or_else(|| "/".to_string());
        let qualified = format!("{}/{node}", namespace.trim_end_matches('/'));
        let mut out: Vec<(String, ParameterValue)> = Vec::new();
        let mut params: *mut rcl::rcl_params_t = std::ptr::null_mut();
        // SAFETY: valid arguments; a null-initialized out pointer that rcl fills with
        // a copy it allocates (freed below), or leaves null when there are none.
        let ret = unsafe { rcl::rcl_arguments_get_param_overrides(&self.args, &mut params) };
        if ret != rcl::RCL_RET_OK as i32 || params.is_null() {
            return out;
        }
        // SAFETY: `params` points to a valid rcl_params_t (see above) whose arrays hold
        // `num_nodes` node names and entries, each entry `num_params` names and values;
        // strings are NUL-terminated; only read here, before the fini below.
        unsafe {
            let p = &*params;
            if !p.params.is_null() && !p.node_names.is_null() {
                let names = std::slice::from_raw_parts(p.node_names, p.num_nodes);
                let entries = std::slice::from_raw_parts(p.params, p.num_nodes);
                for (&n, np) in names.iter().zip(entries) {
                    let n = if n.is_null() { "" } else { CStr::from_ptr(n).to_str().unwrap_or("") };
                    let ours = n == node || section_matches(n, &qualified);
                    if !ours || np.parameter_names.is_null() || np.parameter_values.is_null() {
                        continue;
                    }
                    let keys = std::slice::from_raw_parts(np.parameter_names, np.num_params);
                    let values = std::slice::from_raw_parts(np.parameter_values, np.num_params);
                    for (&k, v) in keys.iter().zip(values) {
                        if k.is_null() {
                            continue;
                        }
                        let key = CStr::from_ptr(k).to_string_lossy().into_owned();
                        let value = parameter_value(v);
                        match out.iter_mut().find(|(name, _)| *name == key) {
                            Some(entry) => entry.1 = value,
                            None => out.push((key, value)),
                        }
                    }
                }
            }
            rcl::rcl_yaml_node_struct_fini(params);
        }
        out
    }
}

/// Whether the parameters-file section `section` applies to the node `fqn`, by rclcpp's
/// rule (`rclcpp::parameter_map_from`): a section without a leading `/` gets one, `/*`
/// stands for one namespace or name token and `/**` for any number of them (none
/// included), everything else is literal.
fn section_matches(section: &str, fqn: &str) -> bool {
    fn tokens(s: &str) -> Vec<&str> {
        s.split('/').filter(|t| !t.is_empty()).collect()
    }
    fn walk(pattern: &[&str], name: &[&str]) -> bool {
        match (pattern.first(), name.first()) {
            (None, None) => true,
            (Some(&"**"), _) => {
                walk(&pattern[1..], name) || (!name.is_empty() && walk(pattern, &name[1..]))
            }
            (Some(&p), Some(&n)) if p == "*" || p == n => walk(&pattern[1..], &name[1..]),
            _ => false,
        }
    }
    walk(&tokens(section), &tokens(fqn))
}

impl Drop for RosArgs {
    fn drop(&mut self) {
        // SAFETY: `args` came from a successful rcl_parse_arguments and is finalized once.
        unsafe { rcl::rcl_arguments_fini(&mut self.args) };
    }
}

#[cfg(test)]
mod tests {
    use super::section_matches;

    #[test]
    fn sections_match_as_in_rclcpp() {
        let fqn = "/robot1/front_camera/vision_preproc";
        for yes in [
            "/**",
            "**",
            "/**/vision_preproc",
            "/robot1/**",
            "/robot1/*/vision_preproc",
            "/*/*/vision_preproc",
            "robot1/front_camera/vision_preproc",
            "/robot1/**/front_camera/vision_preproc",
        ] {
            assert!(section_matches(yes, fqn), "{yes}");
        }
        for no in ["/vision_preproc", "/*/vision_preproc", "/robot2/**", "/**/other", "/robot1/*"] {
            assert!(!section_matches(no, fqn), "{no}");
        }
        assert!(section_matches("/**/vision_preproc", "/vision_preproc"));
        assert!(section_matches("/*", "/vision_preproc"));
    }
}
