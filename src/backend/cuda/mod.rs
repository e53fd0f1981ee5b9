//! The CUDA backend: the specification's function in one fused kernel launch per frame
//! (plus one conv2d launch when configured), with per-stage timing events, on two
//! non-blocking streams. The compute stream runs the kernels and the download. With two
//! submissions in flight ([`Backend::submit_into`] before [`Backend::finish_oldest`] of
//! the previous one: what the node and `replay` do under load), submission k+1 is staged
//! on the host and uploaded on the copy stream (the copy engine) while submission k
//! computes and downloads; the compute stream waits for the upload's event. A submission
//! alone in flight (at camera rate; `process_into`) uploads on the compute stream: a
//! cross-stream wait would only add launch latency.
//!
//! Frame flow (`upload` memory mode, discrete GPUs):
//! host frame -> pinned write-combined ring slot (the one CPU copy, in 4 parallel
//! pieces for large frames) -> device buffer (async copy) -> `resize_normalize_<enc>` ->
//! `conv2d_*` -> device tensor -> async copy straight into the caller's buffer when it
//! is pinned memory of this context ([`Backend::alloc_host`]: the node's serialized
//! `Tensor` message), else into a pinned cached ring slot and one CPU copy out.
//! `mapped` mode (Jetson: CPU and GPU share DRAM): the kernel reads the pinned,
//! device-mapped ring slot where the CPU wrote the frame, and writes the tensor into the
//! caller's mapped buffer (or a mapped slot): no copy on the GPU side at all.
//!
//! Files: `backend.rs` the [`CudaBackend`] and the parts it owns; `steps.rs` the one
//! submission every frame and batch runs (`submit_entry`: stage -> decode -> upload ->
//! launch -> download) on an entry of the one ring (`entry.rs`: its buffers, events and
//! finish); `frame.rs` what one frame launches, `batch.rs` what N frames in one launch
//! do; `kernels.rs` compiling and loading, `kernel_set.rs` the loaded kernels and the
//! conv2d weights, `launch.rs` launch shapes and the kernels' `#[repr(C)]` structs,
//! `memory.rs` pinned and device buffers, `device.rs` what is known of the GPU,
//! `nvjpeg/` the JPEG decoder, `registry.rs` lent host memory, `vmm.rs` shared device
//! blocks; `fault.rs` the test hooks.
//!
//! Everything the GPU touches stays allocated across frames and grows only when a frame
//! needs more. Every kernel is compiled for the device's own architecture at start-up
//! (cached on disk), so a bad kernel fails the node at boot, not on its first frame.
//! Errors: an operation that does not fit its frame, or a buffer of the wrong size, is
//! the caller's mistake (`Error::Operation`, checked before anything is queued); a call
//! out of order (nothing in flight, the ring full) is `Error::Misuse`; a capability the
//! device lacks is `CudaError::Unsupported`; only what the driver reports is a device
//! failure (`Error::Cuda`), which the pipeline's `gpu_failure_policy` acts on.
//!
//! [`Backend::submit_into`]: crate::backend::Backend::submit_into
//! [`Backend::finish_oldest`]: crate::backend::Backend::finish_oldest
//! [`Backend::alloc_host`]: crate::backend::Backend::alloc_host

mod backend;
mod batch;
mod device;
pub(crate) mod driver;
mod entry;
#[cfg(feature = "fault-injection")]
mod fault;
mod fnv;
mod frame;
mod kernel_set;
pub mod kernels;
pub mod launch;
pub mod memory;
pub mod nvjpeg;
mod registry;
mod steps;
pub(crate) mod vmm;

pub use backend::CudaBackend;
pub use device::{resident_blocks, DeviceInfo};
pub use launch::{FusedPath, MAX_BATCH_SLOTS};

/// Which JPEG decoder the CUDA backend would use on this machine, without a GPU: nvJPEG
/// when its library loads (its version and file), else the host decoder (`info`).
pub fn jpeg_decoder() -> String {
    match nvjpeg::probe_library(None) {
        Ok((name, (major, minor, patch))) => format!(
            "nvJPEG {major}.{minor}.{patch} ({name}): JPEG frames decoded on the GPU \
             (its hardware decoder where the GPU has one); PNG on the host"
        ),
        Err(e) => {
            let e = e.to_string();
            let why = if e.contains("cannot open shared object file") {
                "no libnvjpeg here (VISION_PREPROC_NVJPEG_LIBRARY, libnvjpeg.so.13, .so.12, .so \
                 and /usr/local/cuda/lib64 tried)"
                    .to_string()
            } else {
                e
            };
            format!("on the host ({}), then uploaded: {why}", crate::backend::HOST_DECODERS)
        }
    }
}

/// Launch `f` on `stream` with the given arguments, mapping failures to
/// [`CudaError::Launch`](crate::error::CudaError::Launch) with the kernel name and
/// shape. Exported for harnesses that launch the backend's kernels themselves (the CLI's
/// benchmark).
#[macro_export]
macro_rules! launch_kernel {
    ($stream:expr, $f:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let cfg: ::cudarc::driver::LaunchConfig = $cfg;
        let mut b = $stream.launch_builder($f);
        $( ::cudarc::driver::PushKernelArg::arg(&mut b, $arg); )+
        // SAFETY: (for every use of this macro) the arguments match the kernel's
        // parameter list in its .cu file one for one (by-value structs are #[repr(C)]
        // twins checked at compile time, device pointers are u64 addresses of buffers
        // sized by the caller for this launch), and the launch shape is the one the
        // kernel's header comment documents.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| $crate::error::CudaError::Launch {
            kernel: $name.to_string(),
            grid: cfg.grid_dim,
            block: cfg.block_dim,
            message: format!("{e:?}"),
        })
    }};
}
pub use crate::launch_kernel;
