//! `/rosout`: the node's log records as `rcl_interfaces/msg/Log`, as rclcpp and rclpy
//! publish them (rqt_console, `ros2 bag record /rosout`, launch's log capture read them).
//!
//! Since Jazzy, `rcl_node_init` no longer creates the rosout publisher: the client library
//! calls `rcl_logging_rosout_init_publisher_for_node` (rclcpp and rclpy do). r2r 0.9.7
//! neither calls it nor exposes the `rcl_node_t` it needs, so this module does the same
//! work with r2r's public API: a `/rosout` publisher on the node with rcl's rosout QoS
//! (reliable, transient local, depth 1000, lifespan 10 s: `rcl_qos_profile_rosout_default`),
//! and an rcutils output handler, placed in front of rcl's (console and log file), that
//! publishes every record of the node's logger and of its children (`<logger>.<child>`),
//! with rcutils' timestamp, level, file and line, exactly as rcl's rosout handler fills
//! them. Levels are rcutils': a record below the logger's level (`--ros-args --log-level
//! debug`, `--log-level vision_preproc:=warn`) never reaches a handler. `--ros-args
//! --disable-rosout-logs` is honoured (no publisher, no handler).

use r2r::rcl_interfaces::msg::Log;
use r2r::QosProfile;
use r2r_rcl::{
    rcl_logging_rosout_enabled, rcutils_log_location_t, rcutils_logging_get_output_handler,
    rcutils_logging_output_handler_t, rcutils_logging_set_output_handler,
    rcutils_time_point_value_t, va_list,
};
use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

extern "C" {
    /// `src/ros/node/vformat.c`: `vsnprintf` on a `va_copy` of `*args`.
    fn vision_preproc_vformat(
        buf: *mut c_char,
        cap: usize,
        format: *const c_char,
        args: *mut va_list,
    ) -> c_int;
}

/// rcl's `rcl_qos_profile_rosout_default`: late joiners (rqt_console started after the
/// node) get the last 1000 records of the last 10 s.
pub(super) fn rosout_qos() -> QosProfile {
    QosProfile {
        depth: 1000,
        reliability: r2r::qos::ReliabilityPolicy::Reliable,
        durability: r2r::qos::DurabilityPolicy::TransientLocal,
        lifespan: Duration::from_secs(10),
        ..QosProfile::default()
    }
    .keep_last(1000)
}

/// Where the handler publishes, and the handler it forwards to.
struct Sink {
    publisher: r2r::Publisher<Log>,
    /// The node's logger name (`vision_preproc`, `ns.vision_preproc` in a namespace).
    logger: String,
    /// The handler that was installed before ours (rcl's: console, log file).
    previous: rcutils_logging_output_handler_t,
}

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

fn sink() -> MutexGuard<'static, Option<Sink>> {
    SINK.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// Set while this thread is inside the handler: a record logged by the middleware while
    /// we publish (rmw errors go through rcutils) is only forwarded, never published.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

/// Publishing to `/rosout` while alive; dropping it puts the previous handler back (do
/// that before the node goes away).
pub(super) struct Rosout {
    _private: (),
}

impl Rosout {
    /// Create the node's `/rosout` publisher and route the records of `logger` (and its
    /// children) to it. `None` when rosout logging is disabled (`--disable-rosout-logs`).
    /// Call before other threads log (the handler swap is not synchronized with logging).
    pub(super) fn install(node: &mut r2r::Node, logger: &str) -> r2r::Result<Option<Rosout>> {
        // SAFETY: reads a flag rcl_logging_configure set (r2r's Context::create calls it).
        if !unsafe { rcl_logging_rosout_enabled() } {
            return Ok(None);
        }
        let publisher = node.create_publisher::<Log>("/rosout", rosout_qos())?;
        // SAFETY: plain getter of rcutils' global handler pointer.
        let previous = unsafe { rcutils_logging_get_output_handler() };
        *sink() = Some(Sink { publisher, logger: logger.to_string(), previous });
        // SAFETY: `handler` has the signature rcutils expects and stays valid for the
        // whole process (a plain function).
        unsafe { rcutils_logging_set_output_handler(Some(handler)) };
        Ok(Some(Rosout { _private: () }))
    }
}

impl Drop for Rosout {
    fn drop(&mut self) {
        if let Some(s) = sink().take() {
            // SAFETY: restores the handler that was installed before ours.
            unsafe { rcutils_logging_set_output_handler(s.previous) };
        }
    }
}

/// Whether a record of logger `name` belongs on the node's `/rosout`: the node's logger
/// and its children, as rcl's rosout handler (with sub-loggers) publishes.
fn is_ours(name: &str, logger: &str) -> bool {
    name == logger || name.strip_prefix(logger).is_some_and(|rest| rest.starts_with('.'))
}

/// The record's text (`format` applied to `args`), leaving `args` for the next handler.
///
/// # Safety
/// `format` and `args` must be the pair rcutils passed to an output handler.
unsafe fn format_message(format: *const c_char, args: *mut va_list) -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: buf has buf.len() writable bytes; vformat works on a copy of *args.
    let n = unsafe { vision_preproc_vformat(buf.as_mut_ptr().cast(), buf.len(), format, args) };
    let Ok(n) = usize::try_from(n) else {
        return String::new();
    };
    if n >= buf.len() {
        buf = vec![0u8; n + 1];
        // SAFETY: as above, with room for the whole message; *args is still unconsumed.
        unsafe { vision_preproc_vformat(buf.as_mut_ptr().cast(), buf.len(), format, args) };
    }
    buf.truncate(n);
    String::from_utf8_lossy(&buf).into_owned()
}

fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: rcutils passes NUL-terminated strings (or null, handled above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The rcutils output handler: publishes the node's records, then forwards every record
/// to the previous handler.
unsafe extern "C" fn handler(
    location: *const rcutils_log_location_t,
    severity: c_int,
    name: *const c_char,
    timestamp: rcutils_time_point_value_t,
    format: *const c_char,
    args: *mut va_list,
) {
    let (previous, target) = match sink().as_ref() {
        Some(s) => (s.previous, Some((s.publisher.clone(), s.logger.clone()))),
        None => (None, None),
    };
    let reentered = IN_HANDLER.with(|f| f.replace(true));
    if let (Some((publisher, logger)), false) = (target, reentered) {
        let logger_name = c_str(name);
        if is_ours(&logger_name, &logger) {
            // SAFETY: location is null or points to rcutils' location record.
            let (file, function, line) = match unsafe { location.as_ref() } {
                Some(l) => (c_str(l.file_name), c_str(l.function_name), l.line_number),
                None => (String::new(), String::new(), 0),
            };
            let msg = Log {
                stamp: r2r::builtin_interfaces::msg::Time {
                    sec: i32::try_from(timestamp.div_euclid(1_000_000_000)).unwrap_or(i32::MAX),
                    nanosec: timestamp.rem_euclid(1_000_000_000) as u32,
                },
                level: u8::try_from(severity).unwrap_or(u8::MAX),
                name: logger_name,
                // SAFETY: the pair this handler was called with.
                msg: unsafe { format_message(format, args) },
                file,
                function,
                line: u32::try_from(line).unwrap_or(u32::MAX),
            };
            // A failure cannot be logged from here (it would come back to this handler);
            // after the node is gone, publishing fails and the record is dropped.
            let _ = publisher.publish(&msg);
        }
    }
    if !reentered {
        IN_HANDLER.with(|f| f.set(false));
    }
    if let Some(previous) = previous {
        // SAFETY: forwarding the arguments rcutils gave us to the handler it had before.
        unsafe { previous(location, severity, name, timestamp, format, args) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_logger_and_its_children_are_ours() {
        assert!(is_ours("vision_preproc", "vision_preproc"));
        assert!(is_ours("ns.vision_preproc.params", "ns.vision_preproc"));
        assert!(!is_ours("vision_preproc_other", "vision_preproc"));
        assert!(!is_ours("rcl", "vision_preproc"));
    }
}
