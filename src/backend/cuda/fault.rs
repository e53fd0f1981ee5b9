//! Test hooks of the CUDA backend (feature `fault-injection`, off in the product): real
//! device faults for `Backend::inject_fault`, and poisoned outputs.

use super::driver::drv_err;
use super::kernel_set::BackendKernels;
use super::launch;
use super::steps::Gpu;
use crate::backend::FaultKind;
use crate::config::{Border, DType, Layout};
use crate::error::{CudaError, Error, Result};
use crate::launch_kernel;
use cudarc::driver::sys::{self, CUdeviceptr};

/// Fill `len` bytes at `ptr` with 0xFF (NaN as float32 and float16) on the stream.
pub(super) fn memset(ptr: CUdeviceptr, len: usize, stream: sys::CUstream) -> Result<(), CudaError> {
    // SAFETY: callers pass a device buffer of at least `len` bytes owned by the backend.
    unsafe { sys::cuMemsetD8Async(ptr, 0xFF, len, stream) }
        .result()
        .map_err(|e| drv_err("poisoning an output buffer", e))
}

/// `conv2d_tiled_k3` on a null source and destination, queued on the compute stream and
/// not waited for: the device traps when it gets there (an illegal address; the context
/// is lost from then on). Queued inside a submission after its kernels (and before its
/// shared block's event), it is `FaultKind::InFlight`: the submission's finish fails.
pub(super) fn queue_illegal_address(gpu: &Gpu, k: &BackendKernels) -> Result<(), CudaError> {
    let (f, _) = k.conv_kernel(3, false);
    let cp = launch::Conv2dParams {
        width: 64,
        height: 64,
        channels: 1,
        size: 3,
        border: Border::Replicate,
        layout: Layout::Nchw,
        dtype: DType::Float32,
        skip: 0,
    };
    let null: CUdeviceptr = 0;
    // (The macro's SAFETY note covers the argument list; the null pointers are the
    // point: the device traps the access, no host memory is involved.)
    launch_kernel!(
        gpu.stream,
        f,
        "conv2d_tiled_k3",
        launch::conv_tiled_cfg(64, 64),
        &cp,
        &null,
        &null
    )
}

/// A real device fault. `Sticky` (and `InFlight` injected at the launch):
/// `conv2d_tiled_k3` is launched on a null source and destination, so the kernel's first load traps with an illegal
/// address, after which every call on this context fails, as after a real kernel
/// fault. `Transient`: a 1 PiB device allocation, which fails with out-of-memory
/// and leaves the context usable.
pub(super) fn inject(gpu: &Gpu, k: &BackendKernels, kind: FaultKind) -> Error {
    let call = format!("injected {kind:?} fault (VISION_PREPROC_INJECT_CUDA_FAULT, test only)");
    let fault = || -> Result<(), CudaError> {
        gpu.bind()?;
        if kind == FaultKind::Transient {
            let bytes = 1usize << 50;
            // SAFETY: a plain allocation call; on success the memory is freed at once.
            let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes) }
                .map_err(|e| drv_err(format!("{call}: cuMemAlloc({bytes} bytes)"), e))?;
            // SAFETY: ptr was just allocated above and is not used by anything.
            unsafe { cudarc::driver::result::free_sync(ptr) }
                .map_err(|e| drv_err("cuMemFree", e))?;
            return Ok(());
        }
        queue_illegal_address(gpu, k)?;
        gpu.stream
            .synchronize()
            .map_err(|e| drv_err(format!("{call}: conv2d_tiled_k3 on a null pointer"), e))
    };
    match fault() {
        Err(e) => e.into(),
        Ok(()) => Error::misuse(
            call,
            "the device did not fail (no error reported): the fault was not injected",
        ),
    }
}
