//! What the backend knows about its GPU ([`DeviceInfo`], read at start-up) and what it
//! measures of it: the occupancy of the fused kernel, the PCIe link's rates.

use super::driver::drv_err;
use super::steps::Gpu;
use super::{kernels, launch};
use crate::error::{CudaError, Result};
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction};
use std::sync::Arc;

/// What the backend knows about its GPU.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: u32,
    /// Marketing name (`NVIDIA H200`, `Orin`).
    pub name: String,
    /// Compute capability, read from the device.
    pub compute_capability: (i32, i32),
    /// NVRTC target derived from it (`sm_90`).
    pub arch: String,
    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED`: CPU and GPU share DRAM (Jetson).
    pub integrated: bool,
    /// `CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`.
    pub can_map_host_memory: bool,
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// L2 cache in bytes.
    pub l2_bytes: i32,
    /// Peak SM clock reported by the driver, MHz (None if the driver no longer reports it).
    pub max_sm_clock_mhz: Option<f64>,
    /// CUDA driver version (`12060` = 12.6).
    pub driver_version: i32,
    /// NVRTC version used to compile the kernels.
    pub nvrtc_version: (i32, i32),
}

fn attr(ctx: &CudaContext, a: sys::CUdevice_attribute) -> Result<i32, CudaError> {
    ctx.attribute(a).map_err(|e| drv_err(format!("cuDeviceGetAttribute({a:?})"), e))
}

pub(super) fn device_info(ctx: &Arc<CudaContext>, ordinal: u32) -> Result<DeviceInfo, CudaError> {
    use sys::CUdevice_attribute as A;
    let name = ctx.name().map_err(|e| drv_err("cuDeviceGetName", e))?;
    let compute_capability =
        ctx.compute_capability().map_err(|e| drv_err("compute capability", e))?;
    let mut driver_version = 0;
    // SAFETY: a valid out pointer for the duration of the call.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .map_err(|e| drv_err("cuDriverGetVersion", e))?;
    let nvrtc_version = if kernels::nvrtc_available() { kernels::nvrtc_version()? } else { (0, 0) };
    Ok(DeviceInfo {
        ordinal,
        name,
        arch: format!("sm_{}{}", compute_capability.0, compute_capability.1),
        compute_capability,
        integrated: attr(ctx, A::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0,
        can_map_host_memory: attr(ctx, A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? != 0,
        multiprocessors: attr(ctx, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        l2_bytes: attr(ctx, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        max_sm_clock_mhz: attr(ctx, A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
            .ok()
            .filter(|&k| k > 0)
            .map(|k| f64::from(k) / 1e3),
        driver_version,
        nvrtc_version,
    })
}

/// Blocks of the fused kernel `f` that fit on the whole GPU at once (occupancy API x
/// SMs); if the driver cannot say, no cap (one block per tile).
pub fn resident_blocks(f: &CudaFunction, row_words: u32, multiprocessors: i32) -> u32 {
    let threads = launch::RN_BLOCK_X * launch::RN_BLOCK_Y;
    let smem = launch::staged_smem_bytes(row_words) as usize;
    match f.occupancy_max_active_blocks_per_multiprocessor(threads, smem, None) {
        Ok(b) if b > 0 && multiprocessors > 0 => b * multiprocessors as u32,
        _ => u32::MAX,
    }
}

/// PCIe rates (GB/s) of one `h2d`-byte upload and one `d2h`-byte download between
/// pinned host memory and the device, event-timed on the compute stream (median of 7):
/// the roof of anything that moves those bytes (`vision_preproc bench-batch`).
pub(super) fn link_rates(gpu: &Gpu, h2d: usize, d2h: usize) -> Result<(f64, f64)> {
    use sys::CUevent_flags::CU_EVENT_DEFAULT;
    let e = |err: cudarc::driver::DriverError| drv_err("measuring the PCIe link", err);
    gpu.ctx.bind_to_thread().map_err(e)?;
    let stream = &gpu.stream;
    // SAFETY: u8 has no invalid bit patterns; the buffers are only copied from and
    // into, never read as values.
    let host_up = unsafe { gpu.ctx.alloc_pinned::<u8>(h2d) }.map_err(e)?;
    // SAFETY: as above.
    let mut host_down = unsafe { gpu.ctx.alloc_pinned::<u8>(d2h) }.map_err(e)?;
    let mut dev_up = stream.alloc_zeros::<u8>(h2d).map_err(e)?;
    let dev_down = stream.alloc_zeros::<u8>(d2h).map_err(e)?;
    let (mut ups, mut downs) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        let a = stream.record_event(Some(CU_EVENT_DEFAULT)).map_err(e)?;
        stream.memcpy_htod(&host_up, &mut dev_up).map_err(e)?;
        let b = stream.record_event(Some(CU_EVENT_DEFAULT)).map_err(e)?;
        stream.memcpy_dtoh(&dev_down, &mut host_down).map_err(e)?;
        let c = stream.record_event(Some(CU_EVENT_DEFAULT)).map_err(e)?;
        c.synchronize().map_err(e)?;
        ups.push(h2d as f64 / (f64::from(a.elapsed_ms(&b).map_err(e)?) * 1e6));
        downs.push(d2h as f64 / (f64::from(b.elapsed_ms(&c).map_err(e)?) * 1e6));
    }
    let p50 = |v: &[f64]| crate::percentile::Summary::of(v).map_or(0.0, |s| s.p50);
    Ok((p50(&ups), p50(&downs)))
}
