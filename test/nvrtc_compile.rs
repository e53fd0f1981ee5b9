//! CI check that needs no GPU: every kernel file is embedded, compiled by NVRTC at build
//! time for the Jetson Orin (sm_87), the H200 test machine (sm_90) and as PTX, with no
//! error AND no warning; the run-time NVRTC fallback compiles too; and the
//! `#[repr(C)]` structs passed by value match their C twins (the static_asserts in
//! kernels/common.cuh, fed with offsets computed from the Rust structs).
//!
//! NVRTC comes from PyPI `nvidia-cuda-nvrtc-cu12` (installed by scripts/setup/setup.sh, found
//! through LD_LIBRARY_PATH set by .ros/env.sh). Missing NVRTC FAILS this test.

use vision_preproc::backend::cuda::kernels::{
    compile, compile_options, compile_with_options, embedded, nvrtc_available, nvrtc_version,
    KernelFile,
};

fn require_nvrtc() {
    assert!(
        nvrtc_available(),
        "libnvrtc.so.12 cannot be loaded: `source .ros/env.sh` (scripts/setup/setup.sh installs \
         PyPI nvidia-cuda-nvrtc-cu12 and puts it on LD_LIBRARY_PATH)"
    );
}

#[test]
fn every_kernel_is_embedded_for_sm87_and_sm90_without_warnings() {
    // build.rs compiled them with the same NVRTC when this test binary was built (every
    // entry point in every module, and which one a device gets, is checked by the unit
    // tests of src/backend/cuda/kernels.rs).
    require_nvrtc();
    let (major, minor) = nvrtc_version().unwrap();
    assert!(major >= 12, "NVRTC {major}.{minor}: the Jetson's CUDA 12 line or newer is needed");
    assert_eq!(embedded::NOT_EMBEDDED, "", "the build embedded no kernels");
    assert_eq!(embedded::BUILD_NVRTC, format!("{major}.{minor}"));
    for target in ["sm_87", "sm_90", "compute_87"] {
        for file in KernelFile::ALL {
            let e = embedded::EMBEDDED
                .iter()
                .find(|e| e.file == file.file_name() && e.target == target)
                .unwrap_or_else(|| panic!("{} for {target} is not embedded", file.file_name()));
            assert!(
                e.log.is_empty(),
                "{} for {target}: NVRTC printed warnings:\n{}",
                e.file,
                e.log
            );
            let want = compile_options(target).join("\n");
            assert_eq!(e.options, want, "{} for {target}: other options", e.file);
            println!("{} {target}: {} bytes embedded", e.file, e.code.len());
        }
    }
}

#[test]
fn every_kernel_compiles_at_run_time_too() {
    // The NVRTC fallback (other architectures): one file, one architecture, no warning.
    require_nvrtc();
    let c = compile(KernelFile::Conv2dTiled, "sm_87").unwrap();
    assert!(c.log.is_empty(), "{}", c.log);
    assert!(c.cubin.starts_with(b"\x7fELF"));
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
