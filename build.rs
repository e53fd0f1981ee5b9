//! Embeds the ROS 2 library directories in the binaries as DT_RPATH, so that
//! `vision_preproc_node` starts with a clean environment (no sourced setup file, no
//! LD_LIBRARY_PATH). DT_RPATH rather than DT_RUNPATH: RPATH also applies to the
//! dependencies of the libraries we load (librcl -> libfastdds -> vendored libs), which
//! the PyPI wheels cannot find on their own.

//!
//! With the `cuda` feature it also compiles every kernel ahead of time with NVRTC (loaded
//! at build time from `VISION_PREPROC_NVRTC_DIR` or the library path, as at run time):
//! CUBIN for the Jetson Orin (sm_87) and the H200 (sm_90), PTX (compute_87) for the
//! driver to JIT on newer architectures, embedded in the binaries
//! (`$OUT_DIR/embedded_kernels.rs`, read by `src/backend/cuda/kernels.rs`). Without NVRTC
//! the build embeds none and says so; the binary then compiles at run time, as before.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=AMENT_PREFIX_PATH");
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        aot::embed_kernels();
    }
    if env::var_os("CARGO_FEATURE_ROS").is_none() {
        return;
    }
    // The /rosout handler's formatting of C varargs (see the file's comment).
    println!("cargo:rerun-if-changed=src/ros/node/vformat.c");
    cc::Build::new()
        .file("src/ros/node/vformat.c")
        .warnings(true)
        .compile("vision_preproc_vformat");
    let prefixes = env::var("AMENT_PREFIX_PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for prefix in prefixes.split(':').filter(|p| !p.is_empty()) {
        let lib = Path::new(prefix).join("lib");
        if lib.is_dir() {
            dirs.push(lib.clone());
        }
        // PyPI wheels vendor their third-party libraries in site-packages/ros_*.libs.
        dirs.extend(vendored_lib_dirs(&lib));
    }
    for dir in dirs {
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{}", dir.display());
    }
}

fn vendored_lib_dirs(lib: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(lib) else {
        return out;
    };
    for python in entries.flatten() {
        let name = python.file_name();
        if !name.to_string_lossy().starts_with("python3") {
            continue;
        }
        let site = python.path().join("site-packages");
        let Ok(pkgs) = std::fs::read_dir(&site) else {
            continue;
        };
        let mut found: Vec<PathBuf> = pkgs
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .map(|n| {
                            let n = n.to_string_lossy();
                            n.starts_with("ros_") && n.ends_with(".libs")
                        })
                        .unwrap_or(false)
            })
            .collect();
        found.sort();
        out.extend(found);
    }
    out
}

/// The crate's FNV-1a, the same file (the cache's names).
#[path = "src/backend/cuda/fnv.rs"]
mod fnv;

/// Kernels compiled ahead of time (see the file's comment).
mod aot {
    use super::fnv::fnv1a64;
    use std::ffi::{c_char, c_int, CString};
    use std::fmt::Write as _;
    use std::path::{Path, PathBuf};

    /// The kernel files and their variants (extra NVRTC options) the node runs:
    /// `load_backend` in src/backend/cuda/kernels.rs looks each one up by file, target
    /// and its full option list. (The staged variant of the fused kernel, which only the
    /// tests and the benchmark load, is compiled at run time: 3-4 MB less per target.)
    const JOBS: [(&str, &str); 2] = [("resize_normalize.cu", ""), ("conv2d_tiled.cu", "")];
    /// CUBIN targets, then the PTX target.
    const TARGETS: [&str; 3] = ["sm_87", "sm_90", "compute_87"];

    type NvrtcProgram = *mut std::ffi::c_void;

    /// The NVRTC entry points used, from a dlopen'ed libnvrtc.
    struct Nvrtc {
        _lib: libloading::Library,
        version: (c_int, c_int),
        create: unsafe extern "C" fn(
            *mut NvrtcProgram,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int,
        compile: unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> c_int,
        log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
        log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
        cubin_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
        cubin: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
        ptx_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
        ptx: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
        destroy: unsafe extern "C" fn(*mut NvrtcProgram) -> c_int,
    }

    impl Nvrtc {
        fn open() -> Result<Nvrtc, String> {
            let dir = std::env::var_os("VISION_PREPROC_NVRTC_DIR").map(PathBuf::from);
            let mut names: Vec<std::ffi::OsString> = Vec::new();
            if let Some(d) = &dir {
                names.push(d.join("libnvrtc.so.12").into());
            }
            names.extend(["libnvrtc.so.12".into(), "libnvrtc.so".into()]);
            let mut errors = Vec::new();
            for name in names {
                // SAFETY: loading libnvrtc runs its initialisers only (no other code of
                // this build script runs meanwhile).
                match unsafe { libloading::Library::new(&name) } {
                    Ok(lib) => return Nvrtc::bind(lib),
                    Err(e) => errors.push(format!("{}: {e}", name.to_string_lossy())),
                }
            }
            Err(errors.join("; "))
        }

        fn bind(lib: libloading::Library) -> Result<Nvrtc, String> {
            macro_rules! sym {
                ($name:literal) => {
                    // SAFETY: the symbol is NVRTC's C function of that name, whose
                    // signature is the field's type (nvrtc.h, CUDA 12).
                    *unsafe { lib.get($name) }.map_err(|e| format!("libnvrtc: {e}"))?
                };
            }
            let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int =
                sym!(b"nvrtcVersion\0");
            let mut version = (0, 0);
            // SAFETY: two valid out pointers.
            unsafe { version_fn(&mut version.0, &mut version.1) };
            Ok(Nvrtc {
                version,
                create: sym!(b"nvrtcCreateProgram\0"),
                compile: sym!(b"nvrtcCompileProgram\0"),
                log_size: sym!(b"nvrtcGetProgramLogSize\0"),
                log: sym!(b"nvrtcGetProgramLog\0"),
                cubin_size: sym!(b"nvrtcGetCUBINSize\0"),
                cubin: sym!(b"nvrtcGetCUBIN\0"),
                ptx_size: sym!(b"nvrtcGetPTXSize\0"),
                ptx: sym!(b"nvrtcGetPTX\0"),
                destroy: sym!(b"nvrtcDestroyProgram\0"),
                _lib: lib,
            })
        }

        /// Compile `source` (with `common.cuh`) with `options`: the CUBIN (or, for a
        /// `compute_` target, the PTX) and NVRTC's log.
        fn compile(
            &self,
            name: &str,
            source: &str,
            common: &str,
            options: &[String],
            ptx: bool,
        ) -> Result<(Vec<u8>, String), String> {
            let c = |s: &str| CString::new(s).map_err(|e| format!("{name}: {e}"));
            let (src, cname, hdr, hdr_name) = (c(source)?, c(name)?, c(common)?, c("common.cuh")?);
            let opts: Vec<CString> = options.iter().map(|o| c(o)).collect::<Result<_, _>>()?;
            let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
            let mut prog: NvrtcProgram = std::ptr::null_mut();
            // SAFETY: every pointer is a NUL-terminated CString alive until the end of
            // this function; one header, as announced.
            let r = unsafe {
                (self.create)(
                    &mut prog,
                    src.as_ptr(),
                    cname.as_ptr(),
                    1,
                    &hdr.as_ptr(),
                    &hdr_name.as_ptr(),
                )
            };
            if r != 0 {
                return Err(format!("{name}: nvrtcCreateProgram returned {r}"));
            }
            // SAFETY: prog is a live program; opt_ptrs holds opts.len() C strings.
            let status =
                unsafe { (self.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
            let log = self.read(prog, self.log_size, self.log).map(|b| {
                let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
                String::from_utf8_lossy(&b[..end]).trim().to_string()
            });
            let code = if status != 0 {
                Err(format!("{name}: NVRTC error {status}: {}", log.clone().unwrap_or_default()))
            } else if ptx {
                self.read(prog, self.ptx_size, self.ptx)
            } else {
                self.read(prog, self.cubin_size, self.cubin)
            };
            // SAFETY: prog was created above and is destroyed once, here.
            unsafe { (self.destroy)(&mut prog) };
            Ok((code?, log?))
        }

        fn read(
            &self,
            prog: NvrtcProgram,
            size_fn: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
            get_fn: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
        ) -> Result<Vec<u8>, String> {
            let mut size = 0usize;
            // SAFETY: prog is live; size is a valid out pointer.
            if unsafe { size_fn(prog, &mut size) } != 0 {
                return Err("NVRTC: size query failed".into());
            }
            let mut buf = vec![0u8; size.max(1)];
            // SAFETY: buf holds the `size` bytes NVRTC announced.
            if unsafe { get_fn(prog, buf.as_mut_ptr() as *mut c_char) } != 0 {
                return Err("NVRTC: read failed".into());
            }
            buf.truncate(size);
            Ok(buf)
        }
    }

    /// Compile every job for every target (two threads; results kept in
    /// `target/embedded-kernels/`, keyed by source, options and NVRTC version, so the
    /// build's other feature sets reuse them) and write `$OUT_DIR/embedded_kernels.rs`.
    pub fn embed_kernels() {
        let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
        let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
        println!("cargo:rerun-if-changed=kernels");
        println!("cargo:rerun-if-env-changed=VISION_PREPROC_NVRTC_DIR");
        println!("cargo:rerun-if-env-changed=VISION_PREPROC_EMBED_KERNELS");
        let table = match embed(&manifest, &out) {
            Ok(t) => t,
            Err(why) => {
                println!(
                    "cargo:warning=no kernels embedded ({why}): the binary compiles them with \
                     NVRTC when it starts"
                );
                format!(
                    "/// Why no kernel is embedded.\npub const NOT_EMBEDDED: &str = {why:?};\n\
                     /// NVRTC of the build.\npub const BUILD_NVRTC: &str = \"\";\n\
                     /// The embedded kernels.\npub static EMBEDDED: &[Embedded] = &[];\n"
                )
            }
        };
        if let Err(e) = std::fs::write(out.join("embedded_kernels.rs"), table) {
            panic!("writing {}: {e}", out.join("embedded_kernels.rs").display());
        }
    }

    fn embed(manifest: &Path, out: &Path) -> Result<String, String> {
        if std::env::var("VISION_PREPROC_EMBED_KERNELS").is_ok_and(|v| v == "0") {
            return Err("VISION_PREPROC_EMBED_KERNELS=0".into());
        }
        let kernels = manifest.join("kernels");
        let read = |f: &str| {
            std::fs::read_to_string(kernels.join(f)).map_err(|e| format!("kernels/{f}: {e}"))
        };
        let common = read("common.cuh")?;
        let defines: Vec<String> = read("nvrtc_options.txt")?
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        let nvrtc = Nvrtc::open().map_err(|e| format!("libnvrtc not found at build time: {e}"))?;
        let version = format!("{}.{}", nvrtc.version.0, nvrtc.version.1);
        let cache = manifest.join("target").join("embedded-kernels");
        std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
        let mut jobs = Vec::new();
        for (file, extra) in JOBS {
            let source = read(file)?;
            for target in TARGETS {
                // The options of `kernels::compile_options(target)` plus the variant's.
                let mut options = vec![
                    format!("--gpu-architecture={target}"),
                    "--std=c++17".to_string(),
                    "--generate-line-info".to_string(),
                ];
                options.extend(defines.iter().cloned());
                options.extend((!extra.is_empty()).then(|| extra.to_string()));
                let key = fnv1a64(&[
                    common.as_bytes(),
                    source.as_bytes(),
                    options.join(" ").as_bytes(),
                    version.as_bytes(),
                ]);
                let stem = file.trim_end_matches(".cu");
                let path = cache.join(format!("{stem}-{target}-{key:016x}.bin"));
                jobs.push((file, source.clone(), target, options, path));
            }
        }
        // Two threads, one job at a time each (NVRTC is single-threaded per program).
        let next = std::sync::atomic::AtomicUsize::new(0);
        let errors = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((file, source, target, options, path)) = jobs.get(i) else {
                        break;
                    };
                    if path.is_file() {
                        continue;
                    }
                    let ptx = target.starts_with("compute_");
                    let result = nvrtc.compile(file, source, &common, options, ptx).and_then(
                        |(code, log)| {
                            if !log.is_empty() {
                                println!("cargo:warning={file} for {target}: NVRTC: {log}");
                            }
                            // The log beside the code (the tests require it empty).
                            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                            std::fs::write(path.with_extension("log"), &log)
                                .and_then(|()| std::fs::write(&tmp, &code))
                                .and_then(|()| std::fs::rename(&tmp, path))
                                .map_err(|e| format!("{}: {e}", path.display()))
                        },
                    );
                    if let Err(e) = result {
                        if let Ok(mut v) = errors.lock() {
                            v.push(e);
                        }
                    }
                });
            }
        });
        let errors = errors.into_inner().unwrap_or_default();
        if !errors.is_empty() {
            return Err(format!("NVRTC {version} failed: {}", errors.join("; ")));
        }
        let mut t = String::new();
        let _ = writeln!(t, "/// Why no kernel is embedded (empty: they are).");
        let _ = writeln!(t, "pub const NOT_EMBEDDED: &str = \"\";");
        let _ = writeln!(t, "/// NVRTC of the build.");
        let _ = writeln!(t, "pub const BUILD_NVRTC: &str = {version:?};");
        let _ = writeln!(t, "/// The embedded kernels.");
        let _ = writeln!(t, "pub static EMBEDDED: &[Embedded] = &[");
        for (file, _, target, options, cached) in &jobs {
            // Included from OUT_DIR, not from the cache: cargo records paths inside the
            // target directory relative to it, so a copy of the target directory (the
            // colcon test seeds its own from target/release) stays up to date.
            let path = out.join(cached.file_name().unwrap_or_default());
            std::fs::copy(cached, &path).map_err(|e| format!("{}: {e}", path.display()))?;
            let _ = writeln!(
                t,
                "    Embedded {{ file: {file:?}, target: {target:?}, options: {:?}, log: {:?}, \
                 code: include_bytes!({:?}) }},",
                options.join("\n"),
                std::fs::read_to_string(cached.with_extension("log")).unwrap_or_default(),
                path.display().to_string()
            );
        }
        let _ = writeln!(t, "];");
        Ok(t)
    }
}
