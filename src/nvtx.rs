//! NVTX ranges for Nsight Systems and Nsight Compute: one range per frame (or batch) and
//! one per stage inside it, loaded at run time only when a tool asks for them.
//!
//! A tool that records NVTX (Nsight Systems, Nsight Compute, an injection library of a
//! test) sets `NVTX_INJECTION64_PATH` in the process's environment. Only then, at the
//! first range, is the NVTX v2 C library loaded (the CUDA toolkit's
//! `libnvToolsExt.so.1`, or `libnvtx3interop.so.1` of CUDA 12.9+, or the file named by
//! [`LIBRARY_ENV`]); that library loads the tool's injection library and forwards every
//! range to it. Without the variable nothing is loaded and a range costs one atomic load
//! and a branch; a library that does not load leaves the ranges off (the reason is in
//! [`status`]). There is no link-time dependency on NVTX.
//!
//! Names (docs/GPU.md, "NVTX ranges"): the frame range `frame_name` (`frame 17`,
//! `batch 17 (4 items)`), inside it the [`Stage`] ranges (`stage-in`, `upload`,
//! `preprocess`, `conv`, `download`; `publish` on the node's publishing thread) and, for
//! a CPU batch, one `item_name` range per slot on the thread that runs it. A kernel is
//! launched only inside its stage's range, so `ncu --nvtx --nvtx-include "preprocess/"`
//! profiles exactly the fused kernels and `"conv/"` the conv2d ones.

use std::ffi::{c_char, c_int, CString};
use std::marker::PhantomData;
use std::sync::OnceLock;

/// Set by a tool that records NVTX (the path of its injection library): the ranges are
/// on only when it is set.
pub const INJECTION_ENV: &str = "NVTX_INJECTION64_PATH";
/// The NVTX library to load instead of `DEFAULT_LIBRARIES` (a file name the dynamic
/// loader searches for, or a path).
pub const LIBRARY_ENV: &str = "VISION_PREPROC_NVTX_LIBRARY";
/// The NVTX v2 libraries tried in order (by the dynamic loader's search: on a Jetson
/// `/usr/local/cuda/lib64` is on it): the CUDA toolkit's up to 12.8 (JetPack 6), and its
/// replacement from CUDA 12.9 on, which exports the same functions.
pub(crate) const DEFAULT_LIBRARIES: [&str; 2] = ["libnvToolsExt.so.1", "libnvtx3interop.so.1"];

/// A stage of a frame, named by its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The host copy of the frame into the backend's pinned staging buffer (CUDA; with
    /// the sampling tables when they change).
    StageIn,
    /// The host-to-device copies (CUDA).
    Upload,
    /// The fused decode + resize + normalize + layout pass (the fused kernel's launch).
    Preprocess,
    /// conv2d (its kernel's launch).
    Conv,
    /// The device-to-host copy, and the wait for the frame and the copy out (CUDA).
    Download,
    /// Publishing the message, its camera_info and FrameTiming (the node's publishing
    /// thread).
    Publish,
}

impl Stage {
    /// Every stage, in frame order.
    pub const ALL: [Stage; 6] = [
        Stage::StageIn,
        Stage::Upload,
        Stage::Preprocess,
        Stage::Conv,
        Stage::Download,
        Stage::Publish,
    ];

    /// The range's name.
    pub fn name(self) -> &'static str {
        match self {
            Stage::StageIn => "stage-in",
            Stage::Upload => "upload",
            Stage::Preprocess => "preprocess",
            Stage::Conv => "conv",
            Stage::Download => "download",
            Stage::Publish => "publish",
        }
    }
}

/// The name of the range of the pipeline's frame set number `sequence` (1 for the first
/// set a pipeline runs): `frame 17` for one input, `batch 17 (4 items)` for a batch.
pub(crate) fn frame_name(sequence: u64, items: usize, batch: bool) -> String {
    match (batch, items) {
        (false, _) => format!("frame {sequence}"),
        (true, 1) => format!("batch {sequence} (1 item)"),
        (true, n) => format!("batch {sequence} ({n} items)"),
    }
}

/// The name of the range of batch slot `slot` (0-based) where a backend runs the slots
/// on other threads (the CPU backend): `item 2`.
pub(crate) fn item_name(slot: usize) -> String {
    format!("item {slot}")
}

/// The NVTX functions, resolved from the loaded library (kept loaded for the process).
struct Api {
    push: unsafe extern "C" fn(*const c_char) -> c_int,
    pop: unsafe extern "C" fn() -> c_int,
}

/// Loaded or not, and why.
struct State {
    api: Option<Api>,
    status: String,
}

static STATE: OnceLock<State> = OnceLock::new();

fn api() -> Option<&'static Api> {
    STATE.get_or_init(load).api.as_ref()
}

/// Whether ranges are recorded: a tool asked for them and the NVTX library loaded.
pub(crate) fn enabled() -> bool {
    api().is_some()
}

/// What the ranges do in this process, for a log line: `on (libnvToolsExt.so.1; ...)` or
/// `off (...)` with the reason.
pub fn status() -> &'static str {
    &STATE.get_or_init(load).status
}

/// Whether a tool asked for the ranges but they are off (the NVTX library did not load):
/// worth a warning.
pub fn failed() -> bool {
    std::env::var_os(INJECTION_ENV).is_some() && !enabled()
}

fn load() -> State {
    let Some(injection) = std::env::var_os(INJECTION_ENV) else {
        let status = format!("off ({INJECTION_ENV} is not set: no NVTX tool attached)");
        return State { api: None, status };
    };
    let candidates: Vec<String> = match std::env::var(LIBRARY_ENV) {
        Ok(name) if !name.is_empty() => vec![name],
        _ => DEFAULT_LIBRARIES.iter().map(|s| s.to_string()).collect(),
    };
    let mut errors = Vec::new();
    for name in &candidates {
        match open(name) {
            Ok(api) => {
                let status = format!(
                    "on ({name}; {INJECTION_ENV}={})",
                    std::path::Path::new(&injection).display()
                );
                return State { api: Some(api), status };
            }
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    let status = format!(
        "off (a tool set {INJECTION_ENV} but no NVTX library loaded: {}; set {LIBRARY_ENV} \
         to the path of libnvToolsExt.so.1, e.g. /usr/local/cuda/lib64/libnvToolsExt.so.1)",
        errors.join("; ")
    );
    State { api: None, status }
}

fn open(name: &str) -> Result<Api, libloading::Error> {
    // SAFETY: loading the NVTX library runs its initializers, which only set up its
    // function table (the tool's injection library is loaded at the first call, by
    // NVTX's own thread-safe initialization).
    let lib = unsafe { libloading::Library::new(name) }?;
    // SAFETY: the symbols have these C signatures in nvToolsExt.h (NVTX v2 API:
    // `int nvtxRangePushA(const char*)`, `int nvtxRangePop(void)`); the library is never unloaded (forgotten
    // below), so the pointers stay valid for the process.
    let api =
        unsafe { Api { push: *lib.get(b"nvtxRangePushA\0")?, pop: *lib.get(b"nvtxRangePop\0")? } };
    std::mem::forget(lib);
    Ok(api)
}

/// `name` NUL-terminated, on the stack when short (a range name is, except when a
/// caller formats a long one), cut at an interior NUL; `f` gets the C string.
fn with_c_name<T>(name: &str, f: impl FnOnce(*const c_char) -> T) -> T {
    let name = name.split('\0').next().unwrap_or_default();
    let mut buf = [0u8; 64];
    if name.len() < buf.len() {
        buf[..name.len()].copy_from_slice(name.as_bytes());
        return f(buf.as_ptr().cast());
    }
    match CString::new(name) {
        Ok(c) => f(c.as_ptr()),
        Err(_) => f(c"".as_ptr()),
    }
}

/// A push/pop range on this thread, popped when dropped (a no-op when NVTX is off).
/// Ranges of one thread nest: drop them in the reverse order of their creation (scopes
/// do). Not `Send`: NVTX pops the calling thread's innermost range.
#[must_use = "the range ends when this guard is dropped: bind it (`let _range = ...`)"]
pub struct Range {
    api: Option<&'static Api>,
    _thread_bound: PhantomData<*const ()>,
}

impl Range {
    fn push_on(api: Option<&'static Api>, name: &str) -> Range {
        if let Some(api) = api {
            // SAFETY: a NUL-terminated string alive for the call (NVTX copies it).
            with_c_name(name, |c| unsafe { (api.push)(c) });
        }
        Range { api, _thread_bound: PhantomData }
    }
}

impl Range {
    /// Run `f` inside this range, then end it.
    pub fn scope<T>(self, f: impl FnOnce() -> T) -> T {
        let result = f();
        drop(self);
        result
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        if let Some(api) = self.api {
            // SAFETY: this thread pushed the range this guard stands for, and inner
            // guards were dropped first: it is the innermost one.
            unsafe { (api.pop)() };
        }
    }
}

/// Push a range named `name` on this thread.
pub fn push(name: &str) -> Range {
    Range::push_on(api(), name)
}

/// Push the range of `stage`.
pub fn stage(stage: Stage) -> Range {
    push(stage.name())
}

/// Push a range whose name `name()` makes, called only when NVTX is on (a formatted
/// name costs nothing otherwise).
pub(crate) fn push_with(name: impl FnOnce() -> String) -> Range {
    let api = api();
    match api {
        Some(_) => Range::push_on(api, &name()),
        None => Range { api: None, _thread_bound: PhantomData },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use std::sync::Mutex;

    // A stand-in NVTX library: records what the guards call.
    static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn log(event: String) {
        EVENTS.lock().unwrap().push(event);
    }
    fn name(c: *const c_char) -> String {
        // SAFETY: the guards pass NUL-terminated strings alive for the call.
        unsafe { CStr::from_ptr(c) }.to_str().unwrap().to_string()
    }
    unsafe extern "C" fn push(c: *const c_char) -> c_int {
        log(format!("push {}", name(c)));
        0
    }
    unsafe extern "C" fn pop() -> c_int {
        log("pop".into());
        0
    }
    static FAKE: Api = Api { push, pop };

    #[test]
    fn range_names() {
        assert_eq!(frame_name(17, 1, false), "frame 17");
        assert_eq!(frame_name(17, 4, true), "batch 17 (4 items)");
        assert_eq!(frame_name(3, 1, true), "batch 3 (1 item)");
        assert_eq!(item_name(2), "item 2");
        let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["stage-in", "upload", "preprocess", "conv", "download", "publish"]);
    }

    #[test]
    fn guards_push_and_pop_in_order() {
        EVENTS.lock().unwrap().clear();
        {
            let _frame = Range::push_on(Some(&FAKE), "frame 1");
            {
                let _stage = Range::push_on(Some(&FAKE), Stage::Preprocess.name());
            }
            let long = "x".repeat(100);
            let _long = Range::push_on(Some(&FAKE), &long);
            let _cut = Range::push_on(Some(&FAKE), "a\0b");
        }
        let long = format!("push {}", "x".repeat(100));
        assert_eq!(
            *EVENTS.lock().unwrap(),
            [
                "push frame 1",
                "push preprocess",
                "pop",
                long.as_str(),
                "push a",
                "pop",
                "pop",
                "pop"
            ]
        );
        // Off: no call at all.
        let _off = Range::push_on(None, "frame 2");
    }

    #[test]
    fn off_without_a_tool() {
        // The test process has no NVTX tool attached (make test does not set one).
        if std::env::var_os(INJECTION_ENV).is_none() {
            assert!(!enabled());
            assert!(status().starts_with("off ("), "{}", status());
            assert!(!failed());
            let _r = push_with(|| unreachable!("the name is not formatted when off"));
        }
    }
}
