//! `kernels/baselines.cu`, compiled for the benchmark only (the library does not embed
//! it): the straightforward kernels that the fused and tiled ones replace (three-kernel
//! resize/normalize/layout path, naive conv2d), and the SM clock probe.

use super::timing::drv;
use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
use std::sync::Arc;
use vision_preproc::backend::cuda::kernels::{self, KernelSource};
use vision_preproc::backend::cuda::{launch_kernel, CudaBackend};
use vision_preproc::error::{CudaError, Result};

/// The source, embedded in the CLI when it is built with the `bench` feature.
pub const SOURCE: KernelSource = KernelSource {
    file_name: "baselines.cu",
    text: include_str!("../../../../kernels/baselines.cu"),
};

/// Entry points of `kernels/baselines.cu`.
pub const ENTRIES: [&str; 5] = [
    "baseline_resize_rgb8",
    "baseline_normalize_hwc",
    "baseline_hwc_to_chw",
    "conv2d_naive",
    "measure_clock",
];

/// Threads per block of the one-element-per-thread baselines (the header of baselines.cu).
pub const BASELINE_BLOCK: u32 = 256;
/// Block of the naive conv2d baseline.
pub const NAIVE_CONV_BLOCK: (u32, u32) = (32, 8);

/// Launch shape of `conv2d_naive` on a `w` x `h` x `c` image.
pub fn conv_naive_cfg(w: u32, h: u32, c: u32) -> LaunchConfig {
    let (bx, by) = NAIVE_CONV_BLOCK;
    LaunchConfig {
        grid_dim: (w.div_ceil(bx), h.div_ceil(by), c),
        block_dim: (bx, by, 1),
        shared_mem_bytes: 0,
    }
}

/// Launch shape of a one-thread-per-element baseline over `n` elements.
pub fn linear_cfg(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(BASELINE_BLOCK), 1, 1),
        block_dim: (BASELINE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The loaded baselines.
pub struct Baselines {
    module: Arc<CudaModule>,
    /// `baseline_resize_rgb8`.
    pub resize: CudaFunction,
    /// `baseline_normalize_hwc`.
    pub normalize: CudaFunction,
    /// `baseline_hwc_to_chw`.
    pub hwc_to_chw: CudaFunction,
    /// `conv2d_naive`.
    pub conv_naive: CudaFunction,
    clock: CudaFunction,
}

impl Baselines {
    /// Compile (or read from the kernel cache) and load the baselines into `b`'s context.
    pub fn load(b: &CudaBackend) -> Result<Self> {
        let dev = b.device();
        let (module, _) = kernels::load(
            b.context(),
            SOURCE,
            &dev.arch,
            dev.driver_version,
            kernels::cache_dir().as_deref(),
            &[],
        )?;
        let names: Vec<String> = ENTRIES.iter().map(|s| s.to_string()).collect();
        let [resize, normalize, hwc_to_chw, conv_naive, clock] =
            <[CudaFunction; 5]>::try_from(kernels::functions(&module, SOURCE, &names)?)
                .map_err(|_| drv("loading baselines.cu", "expected five entry points"))?;
        Ok(Baselines { module, resize, normalize, hwc_to_chw, conv_naive, clock })
    }

    /// Put `weights` (size x size, row-major) into `c_naive_w`, where `conv2d_naive` reads them.
    pub fn set_naive_weights(&self, b: &CudaBackend, weights: &[f32]) -> Result<(), CudaError> {
        let stream = b.stream();
        let bytes: Vec<u8> = weights.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut sym =
            self.module.get_global("c_naive_w", stream).map_err(|e| drv("c_naive_w", e))?;
        stream
            .memcpy_htod(&bytes, &mut sym.slice_mut(..bytes.len()))
            .map_err(|e| drv("c_naive_w", e))
    }

    /// The SM clock while a spin kernel runs, MHz (clock64 cycles over event time; the
    /// best of three runs).
    pub fn measure_clock(&self, b: &CudaBackend) -> Result<f64, CudaError> {
        let stream = b.stream();
        let out = stream.alloc_zeros::<u64>(1).map_err(|e| drv("allocating the clock probe", e))?;
        let (out_ptr, _t) = cudarc::driver::DevicePtr::device_ptr(&out, stream);
        let cycles: u64 = 50_000_000;
        let ev = || {
            b.context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| drv("cuEventCreate", e))
        };
        let mut best = 0.0f64;
        for _ in 0..3 {
            let (a, z) = (ev()?, ev()?);
            a.record(stream).map_err(|e| drv("cuEventRecord", e))?;
            let cfg =
                LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
            launch_kernel!(stream, &self.clock, "measure_clock", cfg, &cycles, &out_ptr)?;
            z.record(stream).map_err(|e| drv("cuEventRecord", e))?;
            let ms = a.elapsed_ms(&z).map_err(|e| drv("timing the clock probe", e))?;
            best = best.max(cycles as f64 / f64::from(ms) / 1e3);
        }
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_shapes_cover_the_image() {
        assert_eq!(conv_naive_cfg(33, 9, 3).grid_dim, (2, 2, 3));
        assert_eq!(linear_cfg(257).grid_dim, (2, 1, 1));
    }

    /// The benchmark's kernels compile like the backend's (test/nvrtc_compile.rs): for
    /// the Jetson (sm_87) and the H200 (sm_90), without warnings, with every entry point.
    #[test]
    fn baselines_compile_for_sm87_and_sm90_without_warnings() {
        assert!(kernels::nvrtc_available(), "libnvrtc cannot be loaded: `source .ros/env.sh`");
        for arch in ["sm_87", "sm_90"] {
            let c = kernels::compile(SOURCE, arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(c.log.is_empty(), "baselines.cu for {arch}: NVRTC warnings:\n{}", c.log);
            for entry in ENTRIES {
                let found = c.cubin.windows(entry.len()).any(|w| w == entry.as_bytes());
                assert!(found, "baselines.cu for {arch}: entry point {entry} missing");
            }
        }
    }
}
