//! The kernel sources (embedded), the kernels compiled ahead of time (CUBIN for sm_87
//! and sm_90, PTX for compute_87: `build.rs`), their NVRTC compilation for any other
//! architecture, the on-disk cache of compiled modules, and loading. One module owns
//! this: [`KernelFile::ALL`] lists every file of the backend, and the entry-point tables
//! below list every function the host launches. A harness with kernels of its own (the
//! CLI's benchmark and its `baselines.cu`) compiles and loads them through the same
//! functions, as a [`KernelSource`].

use super::driver::drv_err;
use super::fnv::fnv1a64;
use super::launch::{self, BatchItemDesc, Conv2dParams};
use crate::backend::ops::PreprocessParams;
use crate::config::{Border, DType, Interpolation, Layout, MAX_CONV_SIZE};
use crate::error::CudaError;
use crate::image::Encoding;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::sys as nvrtc;
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// `kernels/common.cuh`, included by every kernel file.
pub(crate) const COMMON_CUH: &str = include_str!("../../../kernels/common.cuh");

/// A kernel source file of the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelFile {
    /// `kernels/resize_normalize.cu`: the fused preprocessing.
    ResizeNormalize,
    /// `kernels/conv2d_tiled.cu`: tiled and separable conv2d.
    Conv2dTiled,
}

/// Kernel source text with its file name (for messages and the cache's file names),
/// compiled with `common.cuh` and the options of [`compile_options`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelSource {
    /// File name, e.g. `resize_normalize.cu`.
    pub file_name: &'static str,
    /// The CUDA C source.
    pub text: &'static str,
}

impl From<KernelFile> for KernelSource {
    fn from(file: KernelFile) -> Self {
        KernelSource { file_name: file.file_name(), text: file.source() }
    }
}

impl KernelFile {
    /// Every kernel file of the backend, all loaded at start-up.
    pub const ALL: [KernelFile; 2] = [KernelFile::ResizeNormalize, KernelFile::Conv2dTiled];

    /// File name under `kernels/`.
    pub fn file_name(self) -> &'static str {
        match self {
            KernelFile::ResizeNormalize => "resize_normalize.cu",
            KernelFile::Conv2dTiled => "conv2d_tiled.cu",
        }
    }

    /// The source text, embedded at build time.
    pub fn source(self) -> &'static str {
        match self {
            KernelFile::ResizeNormalize => include_str!("../../../kernels/resize_normalize.cu"),
            KernelFile::Conv2dTiled => include_str!("../../../kernels/conv2d_tiled.cu"),
        }
    }

    /// Every `extern "C"` entry point of the file (the tests' list).
    #[cfg(test)]
    pub(crate) fn entry_points(self) -> Vec<String> {
        match self {
            KernelFile::ResizeNormalize => Encoding::ALL
                .iter()
                .map(|&e| resize_normalize_entry(e))
                .chain([RESIZE_NORMALIZE_BATCH.to_string()])
                .collect(),
            KernelFile::Conv2dTiled => CONV_SIZES
                .iter()
                .flat_map(|k| [format!("conv2d_tiled_k{k}"), format!("conv2d_separable_k{k}")])
                .collect(),
        }
    }
}

/// The fused kernel's entry point for `enc`: `resize_normalize_<name>` (the kernel file
/// stamps one per encoding of `VP_ENCODINGS`, which [`host_defines`] derives from
/// `Encoding`).
pub(crate) fn resize_normalize_entry(enc: Encoding) -> String {
    format!("resize_normalize_{}", enc.name())
}

/// The batched fused kernel: one launch for every slot of a batch (grid z = slot).
pub(crate) const RESIZE_NORMALIZE_BATCH: &str = "resize_normalize_batch";

/// conv2d kernel sizes with an entry point (`conv2d_tiled_k<K>`, `conv2d_separable_k<K>`):
/// every odd size up to `config::MAX_CONV_SIZE`.
pub(crate) const CONV_SIZES: [u32; (MAX_CONV_SIZE as usize).div_ceil(2)] = {
    let mut s = [0u32; (MAX_CONV_SIZE as usize).div_ceil(2)];
    let mut i = 0;
    while i < s.len() {
        s[i] = 2 * i as u32 + 1;
        i += 1;
    }
    s
};

/// The `-D` defines that give the kernels the host's facts, so the `.cu` files hold no
/// copy of them: the `Encoding` codes and table (`ENC_*`, `VP_ENCODINGS(X)`), the codes
/// of `Layout`, `DType`, `Interpolation` and `Border`, the conv2d sizes (`VP_MAX_CONV`,
/// `VP_CONV_SIZES(X)`) and the launch shapes of `launch.rs`.
pub(crate) fn host_defines() -> Vec<String> {
    let mut d = Vec::new();
    let mut table = Vec::new();
    for e in Encoding::ALL {
        let code = format!("ENC_{}", e.name().to_ascii_uppercase());
        d.push(format!("-D{code}={}u", e as u32));
        table.push(format!(
            "X({},{code},{},{})",
            e.name(),
            e.bytes_per_pixel(),
            u8::from(e.is_packed())
        ));
    }
    d.push(format!("-DVP_ENCODINGS(X)={}", table.join(" ")));
    let codes: [(&str, u32); 9] = [
        ("LAYOUT_NCHW", Layout::Nchw as u32),
        ("LAYOUT_NHWC", Layout::Nhwc as u32),
        ("DTYPE_F32", DType::Float32 as u32),
        ("DTYPE_F16", DType::Float16 as u32),
        ("INTERP_NEAREST", Interpolation::Nearest as u32),
        ("INTERP_LINEAR", Interpolation::Linear as u32),
        ("BORDER_REPLICATE", Border::Replicate as u32),
        ("BORDER_CONSTANT", Border::Constant as u32),
        ("BORDER_REFLECT101", Border::Reflect101 as u32),
    ];
    d.extend(codes.iter().map(|(name, v)| format!("-D{name}={v}u")));
    d.push(format!("-DVP_MAX_CONV={MAX_CONV_SIZE}"));
    let sizes: Vec<String> = CONV_SIZES.iter().map(|k| format!("X({k})")).collect();
    d.push(format!("-DVP_CONV_SIZES(X)={}", sizes.join(" ")));
    for (name, v) in [
        ("RN_PX", launch::RN_PX),
        ("RN_BLOCK_X", launch::RN_BLOCK_X),
        ("RN_BLOCK_Y", launch::RN_BLOCK_Y),
        ("CV_BLOCK_X", launch::CV_BLOCK_X),
        ("CV_BLOCK_Y", launch::CV_BLOCK_Y),
        ("CV_ROWS", launch::CV_ROWS),
    ] {
        d.push(format!("-D{name}={v}"));
    }
    d
}

/// `-D` defines carrying the size and every field offset of the `#[repr(C)]` structs
/// passed by value, checked by `static_assert`s in `kernels/common.cuh`.
pub(crate) fn layout_defines() -> Vec<String> {
    macro_rules! fields {
        ($out:ident, $s:ident: $($f:ident),*) => {
            $out.push(format!("-DVP_SIZE_{}={}", stringify!($s), std::mem::size_of::<$s>()));
            $( $out.push(format!(
                "-DVP_OFF_{}_{}={}",
                stringify!($s),
                stringify!($f),
                std::mem::offset_of!($s, $f)
            )); )*
        };
    }
    let mut d = vec!["-DVP_LAYOUT_CHECK".to_string()];
    fields!(d, PreprocessParams: src_width, src_height, src_step, encoding, big_endian,
        dst_width, dst_height, content_x, content_y, content_w, content_h, channels, swap_rb,
        layout, dtype, interpolation, scale, bias, pad);
    fields!(d, Conv2dParams: width, height, channels, size, border, layout, dtype, skip);
    fields!(d, BatchItemDesc: p, reserved, src, maps, dst);
    d
}

/// The NVRTC options for `arch` (e.g. `sm_87`): the host's facts (`host_defines`) and
/// the struct layout checks (`layout_defines`).
pub fn compile_options(arch: &str) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--generate-line-info".to_string(),
    ];
    o.extend(host_defines());
    o.extend(layout_defines());
    o
}

/// True when libnvrtc can be loaded (it is found through `LD_LIBRARY_PATH`).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the candidate names; no symbol is called.
    unsafe { nvrtc::is_culib_present() }
}

/// The NVRTC version, `(major, minor)`. Call only when [`nvrtc_available`].
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for writes for the duration of the call.
    unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Unavailable(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// A compiled kernel file.
#[derive(Clone)]
pub struct Compiled {
    /// The CUBIN (machine code for exactly the requested architecture).
    pub cubin: Vec<u8>,
    /// NVRTC's log (empty when there was nothing to say: no warning, no error).
    pub log: String,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Compiled {{ cubin: {} bytes, log: {:?} }}", self.cubin.len(), self.log)
    }
}

/// An NVRTC program, destroyed on drop.
struct Program(nvrtc::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: self.0 was created by nvrtcCreateProgram and is destroyed only here.
        let _ = unsafe { nvrtc::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn nvrtc_err(file: &str, arch: &str, what: &str, e: impl std::fmt::Debug) -> CudaError {
    CudaError::Compile { file: file.into(), arch: arch.into(), log: format!("{what}: {e:?}") }
}

/// Compile `file` for `arch` (`sm_87`, `sm_90`, ...) into a CUBIN with NVRTC. Needs
/// libnvrtc only, no GPU. Fails with the compiler log on any error.
pub fn compile(file: impl Into<KernelSource>, arch: &str) -> Result<Compiled, CudaError> {
    compile_with_options(file, arch, &compile_options(arch))
}

/// [`compile`] with explicit NVRTC options (tests use it to check that a wrong struct
/// layout define fails the build; the benchmark for variants of a kernel).
pub fn compile_with_options(
    file: impl Into<KernelSource>,
    arch: &str,
    options: &[String],
) -> Result<Compiled, CudaError> {
    let file: KernelSource = file.into();
    let name = file.file_name;
    if !nvrtc_available() {
        return Err(CudaError::Unavailable(
            "libnvrtc.so could not be loaded: install the CUDA 12 NVRTC (PyPI \
             nvidia-cuda-nvrtc-cu12, or the JetPack CUDA toolkit) and add its lib directory \
             to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let cstr = |s: &str| CString::new(s).map_err(|e| nvrtc_err(name, arch, "NUL in text", e));
    let src = cstr(file.text)?;
    let cname = cstr(name)?;
    let hdr = cstr(COMMON_CUH)?;
    let hdr_name = cstr("common.cuh")?;
    let headers: [*const c_char; 1] = [hdr.as_ptr()];
    let include_names: [*const c_char; 1] = [hdr_name.as_ptr()];
    let mut raw: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a NUL-terminated CString that outlives the program
    // (they are dropped at the end of this function, after `prog`), and the two header
    // arrays both have 1 element as announced.
    unsafe {
        nvrtc::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            cname.as_ptr(),
            1,
            headers.as_ptr(),
            include_names.as_ptr(),
        )
    }
    .result()
    .map_err(|e| nvrtc_err(name, arch, "nvrtcCreateProgram", e))?;
    let prog = Program(raw);
    let opts: Vec<CString> = options.iter().map(|o| cstr(o)).collect::<Result<_, _>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: prog.0 is a live program; opt_ptrs holds opts.len() valid C strings.
    let status =
        unsafe { nvrtc::nvrtcCompileProgram(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    let log = program_log(&prog).unwrap_or_else(|e| format!("(no log: {e:?})"));
    if status != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Compile {
            file: name.into(),
            arch: arch.into(),
            log: format!("{status:?}\n{log}"),
        });
    }
    let mut size = 0usize;
    // SAFETY: prog.0 compiled successfully; size is a valid out pointer.
    unsafe { nvrtc::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| nvrtc_err(name, arch, "nvrtcGetCUBINSize", e))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: cubin has exactly the `size` bytes NVRTC asked for.
    unsafe { nvrtc::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr() as *mut c_char) }
        .result()
        .map_err(|e| nvrtc_err(name, arch, "nvrtcGetCUBIN", e))?;
    Ok(Compiled { cubin, log })
}

fn program_log(prog: &Program) -> Result<String, nvrtc::nvrtcResult> {
    let mut size = 0usize;
    // SAFETY: prog.0 is a live program; size is a valid out pointer.
    let r = unsafe { nvrtc::nvrtcGetProgramLogSize(prog.0, &mut size) };
    if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return Err(r);
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: buf holds at least the `size` bytes (NUL included) NVRTC reported.
    let r = unsafe { nvrtc::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr() as *mut c_char) };
    if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return Err(r);
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).trim().to_string())
}

/// Where compiled modules are cached: `$VISION_PREPROC_KERNEL_CACHE` (empty disables the
/// cache), else `$XDG_CACHE_HOME/vision_preproc/kernels`, else
/// `$HOME/.cache/vision_preproc/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("VISION_PREPROC_KERNEL_CACHE") {
        return if dir.is_empty() { None } else { Some(PathBuf::from(dir)) };
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("vision_preproc/kernels"));
    }
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|h| PathBuf::from(h).join(".cache/vision_preproc/kernels"))
}

/// A kernel module compiled when the binary was built (`build.rs`).
#[derive(Debug)]
pub struct Embedded {
    /// The kernel file, e.g. `resize_normalize.cu`.
    pub file: &'static str,
    /// `sm_87`, `sm_90` (CUBIN) or `compute_87` (PTX, JIT-compiled by the driver).
    pub target: &'static str,
    /// Every NVRTC option it was compiled with, one per line: it is used only when they
    /// are exactly the options this binary would compile it with.
    pub options: &'static str,
    /// NVRTC's log (warnings; empty when it had nothing to say).
    pub log: &'static str,
    /// The CUBIN, or the PTX text (NUL-terminated).
    pub code: &'static [u8],
}

/// The kernels embedded by `build.rs`.
pub mod embedded {
    use super::Embedded;
    include!(concat!(env!("OUT_DIR"), "/embedded_kernels.rs"));
}

/// The options `nvrtc_options.txt` must hold: [`host_defines`] and [`layout_defines`]
/// (`build.rs` compiles the embedded kernels with them; the test of this module checks
/// the file).
#[cfg(test)]
pub(crate) fn nvrtc_options_file() -> String {
    let mut text = String::from(
        "# The -D options of every kernel compilation, written by the test of\n\
         # src/backend/cuda/kernels.rs (VISION_PREPROC_WRITE_NVRTC_OPTIONS=1): build.rs reads\n\
         # them to compile the embedded kernels without the crate's types.\n",
    );
    for o in host_defines().into_iter().chain(layout_defines()) {
        text.push_str(&o);
        text.push('\n');
    }
    text
}

/// Which kernels the backend loads (`VISION_PREPROC_KERNELS`): `auto` (default: the
/// embedded CUBIN of the device's architecture, else the embedded PTX, else NVRTC),
/// `ptx` (the embedded PTX, else NVRTC) or `nvrtc` (compile at start-up, or read the
/// disk cache, as without embedded kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelPolicy {
    /// CUBIN, then PTX, then NVRTC.
    Auto,
    /// PTX, then NVRTC.
    Ptx,
    /// NVRTC (or its disk cache) only.
    Nvrtc,
}

impl KernelPolicy {
    /// From `VISION_PREPROC_KERNELS` (unset or empty: `auto`).
    pub(crate) fn from_env() -> Result<KernelPolicy, CudaError> {
        match std::env::var("VISION_PREPROC_KERNELS").unwrap_or_default().as_str() {
            "" | "auto" => Ok(KernelPolicy::Auto),
            "ptx" => Ok(KernelPolicy::Ptx),
            "nvrtc" => Ok(KernelPolicy::Nvrtc),
            other => Err(CudaError::Unavailable(format!(
                "VISION_PREPROC_KERNELS={other}: expected auto, ptx or nvrtc"
            ))),
        }
    }
}

/// Where a module came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The CUBIN embedded at build time for the device's architecture.
    EmbeddedCubin,
    /// The embedded PTX, JIT-compiled by the driver.
    EmbeddedPtx,
    /// The disk cache of an earlier NVRTC compilation.
    Cache,
    /// Compiled with NVRTC at start-up.
    Compiled,
}

impl Origin {
    /// For logs and reports.
    pub fn name(self) -> &'static str {
        match self {
            Origin::EmbeddedCubin => "embedded cubin",
            Origin::EmbeddedPtx => "embedded ptx",
            Origin::Cache => "nvrtc cache",
            Origin::Compiled => "nvrtc",
        }
    }
}

/// How one module was obtained, for the start-up log and the benchmark.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// The kernel file.
    pub file: &'static str,
    /// Where it came from.
    pub origin: Origin,
    /// Milliseconds spent compiling (0 unless [`Origin::Compiled`]) or, for embedded
    /// code, loading it (the driver's JIT for PTX).
    pub compile_ms: f64,
    /// NVRTC's log (warnings), empty when cached or silent.
    pub log: String,
    /// Why the embedded code was not used (empty when it was).
    pub why_not_embedded: String,
}

impl LoadReport {
    /// One line for logs: `resize_normalize.cu: embedded cubin (sm_90)`.
    pub fn describe(&self, arch: &str) -> String {
        let mut s =
            format!("{}: {} ({arch}, {:.0} ms)", self.file, self.origin.name(), self.compile_ms);
        if !self.why_not_embedded.is_empty() {
            s.push_str(&format!(": {}", self.why_not_embedded));
        }
        s
    }
}

/// The embedded module of `file` for the device's `arch` under `policy`, with `options`
/// (NVRTC options for `arch`), or why there is none.
pub(super) fn find_embedded(
    file: &str,
    arch: &str,
    extra: &[String],
    policy: KernelPolicy,
) -> Result<(&'static Embedded, Origin), String> {
    if policy == KernelPolicy::Nvrtc {
        return Err("VISION_PREPROC_KERNELS=nvrtc".into());
    }
    if embedded::EMBEDDED.is_empty() {
        return Err(format!("this binary embeds no kernels ({})", embedded::NOT_EMBEDDED));
    }
    let wanted = |target: &str| {
        let mut o = compile_options(target);
        o.extend(extra.iter().cloned());
        o.join("\n")
    };
    let find = |target: &str| {
        embedded::EMBEDDED
            .iter()
            .find(|e| e.file == file && e.target == target && e.options == wanted(target))
    };
    if policy == KernelPolicy::Auto {
        if let Some(e) = find(arch) {
            return Ok((e, Origin::EmbeddedCubin));
        }
    }
    // PTX of compute_XY runs on sm_XY and newer.
    let cc =
        |t: &str| t.trim_start_matches("sm_").trim_start_matches("compute_").parse::<u32>().ok();
    match embedded::EMBEDDED.iter().find(|e| e.file == file && e.target.starts_with("compute_")) {
        Some(ptx) if cc(arch) >= cc(ptx.target) => match find(ptx.target) {
            Some(e) => Ok((e, Origin::EmbeddedPtx)),
            None => Err(format!("the embedded {file} was built with other options")),
        },
        Some(ptx) => {
            Err(format!("no embedded cubin for {arch}, and its PTX ({}) is newer", ptx.target))
        }
        None => Err(format!("no embedded {file}")),
    }
}

/// A kernel file's CUBIN, from the disk cache or freshly compiled (no GPU involved: this
/// step can run on several threads at once, one file each).
pub struct Prepared {
    file: KernelSource,
    arch: String,
    options: Vec<String>,
    path: Option<std::path::PathBuf>,
    cubin: Vec<u8>,
    report: LoadReport,
}

/// Get the CUBIN of `file` for `arch` (with `extra_options` after the standard ones): from
/// the disk cache directory `cache` when a CUBIN for this exact source, options,
/// architecture, NVRTC and driver is there, else compile it (failing with the compiler
/// log) and store it there.
pub fn prepare(
    file: impl Into<KernelSource>,
    arch: &str,
    driver_version: i32,
    cache: Option<&std::path::Path>,
    extra_options: &[String],
) -> Result<Prepared, CudaError> {
    let file: KernelSource = file.into();
    let (nv_major, nv_minor) = nvrtc_version()?;
    let mut options = compile_options(arch);
    options.extend(extra_options.iter().cloned());
    let versions = format!("nvrtc {nv_major}.{nv_minor} driver {driver_version}");
    let key = fnv1a64(&[
        COMMON_CUH.as_bytes(),
        file.text.as_bytes(),
        options.join(" ").as_bytes(),
        versions.as_bytes(),
    ]);
    let stem = file.file_name.trim_end_matches(".cu");
    let path = cache.map(|d| d.join(format!("{stem}-{arch}-{key:016x}.cubin")));
    if let Some(cubin) = path.as_ref().and_then(|p| read_cached(p)) {
        let report = LoadReport {
            file: file.file_name,
            origin: Origin::Cache,
            compile_ms: 0.0,
            log: String::new(),
            why_not_embedded: String::new(),
        };
        return Ok(Prepared { file, arch: arch.into(), options, path, cubin, report });
    }
    compile_prepared(file, arch, options, path)
}

fn compile_prepared(
    file: KernelSource,
    arch: &str,
    options: Vec<String>,
    path: Option<std::path::PathBuf>,
) -> Result<Prepared, CudaError> {
    let t = Instant::now();
    let compiled = compile_with_options(file, arch, &options)?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    if let Some(p) = &path {
        // A cache that cannot be written only costs the next start its compile time.
        let _ = write_cached(p, &compiled.cubin);
    }
    let report = LoadReport {
        file: file.file_name,
        origin: Origin::Compiled,
        compile_ms,
        log: compiled.log,
        why_not_embedded: String::new(),
    };
    Ok(Prepared { file, arch: arch.into(), options, path, cubin: compiled.cubin, report })
}

/// Load a prepared CUBIN into `ctx`. A cached CUBIN the driver refuses is compiled again
/// (and the cache entry replaced).
pub(crate) fn load_prepared(
    ctx: &Arc<CudaContext>,
    p: Prepared,
) -> Result<(Arc<CudaModule>, LoadReport), CudaError> {
    let load = |p: &Prepared| {
        ctx.load_module(cudarc::nvrtc::Ptx::from_binary(p.cubin.clone())).map_err(|e| {
            drv_err(format!("cuModuleLoadData({} for {})", p.file.file_name, p.arch), e)
        })
    };
    let p = match load(&p) {
        Ok(module) => return Ok((module, p.report)),
        Err(_) if p.report.origin == Origin::Cache => {
            compile_prepared(p.file, &p.arch, p.options, p.path)?
        }
        Err(e) => return Err(e),
    };
    Ok((load(&p)?, p.report))
}

/// [`prepare`] then `load_prepared`.
pub fn load(
    ctx: &Arc<CudaContext>,
    file: impl Into<KernelSource>,
    arch: &str,
    driver_version: i32,
    cache: Option<&std::path::Path>,
    extra_options: &[String],
) -> Result<(Arc<CudaModule>, LoadReport), CudaError> {
    load_prepared(ctx, prepare(file, arch, driver_version, cache, extra_options)?)
}

/// The cached CUBIN at `path` if it exists and its trailing checksum matches.
fn read_cached(path: &std::path::Path) -> Option<Vec<u8>> {
    let mut bytes = std::fs::read(path).ok()?;
    if bytes.len() < 8 {
        return None;
    }
    let body_len = bytes.len() - 8;
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&bytes[body_len..]);
    if u64::from_le_bytes(sum) != fnv1a64(&[&bytes[..body_len]]) {
        return None;
    }
    bytes.truncate(body_len);
    Some(bytes)
}

/// Write `cubin` + checksum to `path` atomically (temporary file, then rename).
fn write_cached(path: &std::path::Path, cubin: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut data = cubin.to_vec();
    data.extend_from_slice(&fnv1a64(&[cubin]).to_le_bytes());
    std::fs::write(&tmp, &data)?;
    std::fs::rename(&tmp, path)
}

/// Look up every entry point of `names` in `module` (compiled from `file`).
pub fn functions(
    module: &Arc<CudaModule>,
    file: impl Into<KernelSource>,
    names: &[String],
) -> Result<Vec<CudaFunction>, CudaError> {
    let file: KernelSource = file.into();
    names
        .iter()
        .map(|n| {
            module
                .load_function(n)
                .map_err(|e| drv_err(format!("cuModuleGetFunction({n} in {})", file.file_name), e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nvrtc_options_file_is_current() {
        // build.rs compiles the embedded kernels with kernels/nvrtc_options.txt: it must
        // hold exactly this crate's defines (else the embedded kernels would not match
        // and every start would compile). VISION_PREPROC_WRITE_NVRTC_OPTIONS=1 rewrites it.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/nvrtc_options.txt");
        let want = nvrtc_options_file();
        if std::env::var_os("VISION_PREPROC_WRITE_NVRTC_OPTIONS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "kernels/nvrtc_options.txt is out of date: run \
             VISION_PREPROC_WRITE_NVRTC_OPTIONS=1 cargo test --release --lib nvrtc_options"
        );
    }

    #[test]
    fn embedded_kernels_are_found_by_architecture_and_options() {
        // Built with NVRTC (make build's environment): every file for sm_87, sm_90 and
        // compute_87 with this binary's options.
        if !embedded::NOT_EMBEDDED.is_empty() {
            assert!(embedded::EMBEDDED.is_empty());
            return;
        }
        let none: &[String] = &[];
        let staged = ["-DRN_STAGED=1".to_string()];
        for file in KernelFile::ALL {
            let f = file.file_name();
            for arch in ["sm_87", "sm_90"] {
                let (e, origin) = find_embedded(f, arch, none, KernelPolicy::Auto).unwrap();
                assert_eq!((e.target, origin), (arch, Origin::EmbeddedCubin));
                assert!(e.code.starts_with(b"\x7fELF"), "{f} {arch}");
                // Forced PTX: the compute_87 PTX.
                let (e, origin) = find_embedded(f, arch, none, KernelPolicy::Ptx).unwrap();
                assert_eq!((e.target, origin), ("compute_87", Origin::EmbeddedPtx));
                assert!(e.code.starts_with(b"//") && e.code.ends_with(b"\0"), "{f} ptx");
            }
            // Newer than both: the PTX; older than the PTX: nothing (NVRTC then).
            assert_eq!(
                find_embedded(f, "sm_100", none, KernelPolicy::Auto).unwrap().1,
                Origin::EmbeddedPtx
            );
            let why = find_embedded(f, "sm_75", none, KernelPolicy::Auto).unwrap_err();
            assert!(why.contains("no embedded cubin for sm_75"), "{why}");
            assert!(find_embedded(f, "sm_90", none, KernelPolicy::Nvrtc).is_err());
            // Every entry point is in every embedded module of the file.
            for e in embedded::EMBEDDED.iter().filter(|e| e.file == f) {
                for entry in file.entry_points() {
                    let found = e.code.windows(entry.len()).any(|w| w == entry.as_bytes());
                    assert!(found, "{f} {}: entry point {entry} missing", e.target);
                }
            }
        }
        // The staged variant of the fused kernel (tests and benchmark only) is not
        // embedded: other options never match, not even the PTX.
        let rn = KernelFile::ResizeNormalize.file_name();
        let why = find_embedded(rn, "sm_87", &staged, KernelPolicy::Auto).unwrap_err();
        assert!(why.contains("built with other options"), "{why}");
        assert_eq!(embedded::EMBEDDED.len(), 6);
    }

    #[test]
    fn fnv_separates_parts_and_detects_changes() {
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
        assert_ne!(fnv1a64(&[b"abc"]), fnv1a64(&[b"abd"]));
        assert_eq!(fnv1a64(&[b"abc"]), fnv1a64(&[b"abc"]));
    }

    #[test]
    fn cache_files_round_trip_and_reject_corruption() {
        let dir = std::env::temp_dir().join(format!("vp_cache_test_{}", std::process::id()));
        let p = dir.join("x.cubin");
        write_cached(&p, b"\x7fELF fake cubin").unwrap();
        assert_eq!(read_cached(&p).as_deref(), Some(&b"\x7fELF fake cubin"[..]));
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[2] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(read_cached(&p), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn entry_points_are_stamped_from_the_host_tables() {
        // The files hold no list of their own: the fused file stamps one entry point per
        // encoding of VP_ENCODINGS, the conv2d file two per size of VP_CONV_SIZES
        // (test/nvrtc_compile.rs finds every name of `entry_points` in the CUBIN).
        let rn = KernelFile::ResizeNormalize.source();
        assert!(rn.contains("\nVP_ENCODINGS(RN_ENTRY_OF)\n") && !rn.contains("RN_ENTRY(rgb8"));
        let cv = KernelFile::Conv2dTiled.source();
        assert!(cv.contains("\nVP_CONV_SIZES(CV_ENTRY)\n") && !cv.contains("CV_ENTRY(3)"));
        // ... plus the batched entry point, which dispatches over the same table.
        assert_eq!(KernelFile::ResizeNormalize.entry_points().len(), Encoding::ALL.len() + 1);
        assert!(rn.contains("VP_ENCODINGS(RN_BATCH_CASE)"));
        assert!(KernelFile::ResizeNormalize
            .entry_points()
            .contains(&RESIZE_NORMALIZE_BATCH.to_string()));
        assert_eq!(KernelFile::Conv2dTiled.entry_points().len(), 2 * CONV_SIZES.len());
        assert_eq!(resize_normalize_entry(Encoding::BayerGrbg8), "resize_normalize_bayer_grbg8");
    }

    #[test]
    fn host_defines_carry_the_tables() {
        let d = host_defines();
        // `Encoding::Nv12 as u32` is 10, its name nv12; bgr16 is 6 bytes per pixel, packed.
        assert!(d.contains(&"-DENC_NV12=10u".to_string()), "{d:?}");
        let table = d.iter().find(|o| o.starts_with("-DVP_ENCODINGS(X)=")).unwrap();
        assert!(table.contains("X(bgr16,ENC_BGR16,6,1) X(yuyv,ENC_YUYV,2,1)"), "{table}");
        assert!(table.contains("X(nv12,ENC_NV12,1,0)"), "{table}");
        assert_eq!(table.matches("X(").count(), Encoding::ALL.len());
        assert_eq!(CONV_SIZES, [1, 3, 5, 7, 9, 11, 13, 15]);
        assert!(d.contains(
            &"-DVP_CONV_SIZES(X)=X(1) X(3) X(5) X(7) X(9) X(11) X(13) X(15)".to_string()
        ));
        assert!(d.contains(&"-DDTYPE_F16=1u".to_string()) && d.contains(&"-DRN_PX=4".to_string()));
    }
}
