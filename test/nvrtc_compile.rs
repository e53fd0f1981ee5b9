//! CI check that needs no GPU: every kernel file compiles with NVRTC for the Jetson Orin
//! (sm_87) and the H200 test machine (sm_90) with no error AND no warning, and the
//! `#[repr(C)]` structs passed by value match their C twins (the static_asserts in
//! kernels/common.cuh, fed with offsets computed from the Rust structs).
//!
//! NVRTC comes from PyPI `nvidia-cuda-nvrtc-cu12` (installed by scripts/setup.sh, found
//! through LD_LIBRARY_PATH set by .ros/env.sh). Missing NVRTC FAILS this test.

use vision_preproc::backend::cuda::kernels::{
    compile, compile_options, compile_with_options, nvrtc_available, nvrtc_version, KernelFile,
};

const ARCHES: [&str; 2] = ["sm_87", "sm_90"];

fn require_nvrtc() {
    assert!(
        nvrtc_available(),
        "libnvrtc.so.12 cannot be loaded: `source .ros/env.sh` (scripts/setup.sh installs \
         PyPI nvidia-cuda-nvrtc-cu12 and puts it on LD_LIBRARY_PATH)"
    );
}

#[test]
fn every_kernel_compiles_for_sm87_and_sm90_without_warnings() {
    require_nvrtc();
    let (major, minor) = nvrtc_version().unwrap();
    assert!(major >= 12, "NVRTC {major}.{minor}: the Jetson's CUDA 12 line or newer is needed");
    for arch in ARCHES {
        for file in KernelFile::ALL {
            let t = std::time::Instant::now();
            let c = compile(file, arch).unwrap_or_else(|e| panic!("NVRTC {major}.{minor}: {e}"));
            let secs = t.elapsed().as_secs_f64();
            assert!(
                c.log.is_empty(),
                "{} for {arch}: NVRTC {major}.{minor} printed warnings:\n{}",
                file.file_name(),
                c.log
            );
            assert!(c.cubin.starts_with(b"\x7fELF"), "{}: not an ELF cubin", file.file_name());
            for entry in file.entry_points() {
                let found = c.cubin.windows(entry.len()).any(|w| w == entry.as_bytes());
                assert!(found, "{} for {arch}: entry point {entry} missing", file.file_name());
            }
            println!(
                "{} {arch}: {} entry points, {} bytes of CUBIN, {secs:.1} s",
                file.file_name(),
                file.entry_points().len(),
                c.cubin.len()
            );
        }
    }
}

#[test]
fn a_struct_layout_mismatch_fails_the_build() {
    require_nvrtc();
    // Pretend the Rust struct's `pad` field moved: the C side must refuse to compile.
    let opts: Vec<String> = compile_options("sm_87")
        .into_iter()
        .map(|o| {
            if o.starts_with("-DVP_OFF_PreprocessParams_pad=") {
                "-DVP_OFF_PreprocessParams_pad=4".to_string()
            } else {
                o
            }
        })
        .collect();
    let err = compile_with_options(KernelFile::ResizeNormalize, "sm_87", &opts).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("PreprocessParams.pad: offset differs from the Rust struct"), "{msg}");
    assert!(msg.contains("resize_normalize.cu") && msg.contains("sm_87"), "{msg}");
}

#[test]
fn a_syntax_error_reports_the_compiler_log() {
    require_nvrtc();
    let mut opts = compile_options("sm_90");
    opts.push("-DPreprocessParams=1".to_string()); // `struct 1 {`: a syntax error
    let err = compile_with_options(KernelFile::ResizeNormalize, "sm_90", &opts).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("compiling kernel file `resize_normalize.cu` for sm_90 failed"),
        "{msg}"
    );
    assert!(msg.contains("error"), "the log must be in the message: {msg}");
}
