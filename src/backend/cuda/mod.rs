//! The CUDA backend: the specification's function in one fused kernel launch per frame
//! (plus one conv2d launch when configured), with per-stage timing events, on two
//! non-blocking streams. The compute stream runs the kernels and the download. With two
//! frames (or batches) in flight ([`CudaBackend::submit`] before [`CudaBackend::finish`]
//! of the previous one, [`CudaBackend::submit_batch`]), frame k+1 is staged on the host
//! and uploaded on the copy stream (the copy engine) while frame k computes and
//! downloads; the compute stream waits for the upload's event. A frame alone in flight
//! (`process_into`, what the node runs) uploads on the compute stream: a cross-stream
//! wait would only add launch latency.
//!
//! Frame flow (`upload` memory mode, discrete GPUs):
//! host frame -> pinned write-combined ring slot (the one CPU copy, in 4 parallel
//! pieces for large frames) -> device buffer (async copy) -> `resize_normalize_<enc>` ->
//! [`conv2d_*`] -> device tensor -> async copy straight into the caller's buffer when it
//! is pinned memory of this context ([`Backend::alloc_host`]: the node's serialized
//! `Tensor` message), else into a pinned cached ring slot and one CPU copy out.
//! `mapped` mode (Jetson: CPU and GPU share DRAM): the kernel reads the pinned,
//! device-mapped ring slot where the CPU wrote the frame, and writes the tensor into the
//! caller's mapped buffer (or a mapped slot): no copy on the GPU side at all.
//!
//! Everything the GPU touches stays allocated across frames and grows only when a frame
//! needs more. Every kernel is compiled for the device's own architecture at start-up
//! (cached on disk), so a bad kernel fails the node at boot, not on its first frame.

pub mod batch;
#[cfg(feature = "fault-injection")]
mod fault;
pub mod kernels;
pub mod launch;
pub mod memory;

use crate::backend::{AxisMap, Backend, Conv2dOp, PreprocessOp, PreprocessParams, StageTimes};
use crate::config::{DType, Layout, MemoryMode};
use crate::error::{CudaError, Result};
use crate::image::{Encoding, ImageView};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream};
use kernels::{resize_normalize_entry, KernelFile, LoadReport, CONV_SIZES};
use memory::{DeviceBuffer, PinnedBuffer, PinnedKind, SRC_SLACK};
use std::sync::Arc;
use std::time::Instant;

/// Frames that can be in flight at once: the ring of pinned staging buffers lets the CPU
/// stage frame N+1 while the GPU still works on frame N.
pub const RING: usize = 2;

/// How the fused kernel reads packed encodings (rgb8 ... bgr16, yuyv, uyvy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedPath {
    /// Straight from global memory through L1 (the default: measured faster on the H200,
    /// docs/GPU.md).
    Direct,
    /// Through a shared-memory copy of each tile's source window (cp.async), when the
    /// window fits; compiled with `-DRN_STAGED=1`.
    Staged,
}

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

fn drv_err(call: impl Into<String>, e: impl std::fmt::Debug) -> CudaError {
    CudaError::Driver { call: call.into(), message: format!("{e:?}") }
}

fn attr(ctx: &CudaContext, a: sys::CUdevice_attribute) -> Result<i32, CudaError> {
    ctx.attribute(a).map_err(|e| drv_err(format!("cuDeviceGetAttribute({a:?})"), e))
}

/// Launch `f` on `stream` with the given arguments, mapping failures to
/// [`CudaError::Launch`] with the kernel name and shape. Exported for harnesses that
/// launch the backend's kernels themselves (the CLI's benchmark).
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

/// Timing events of one frame or batch in flight: start and after upload (copy
/// stream), start of the kernels (compute stream, after waiting for the upload), after
/// preprocess, after conv, after download (compute stream). The last one means done.
pub(crate) const EVENTS: usize = 6;

/// One ring slot: the pinned buffers and timing events of one frame in flight.
struct Slot {
    /// Frame bytes: write-combined (`upload`) or mapped (`mapped`).
    input: Option<PinnedBuffer>,
    /// The frame on the device (`upload` mode): its own per slot, so the upload of the
    /// next frame never overwrites the one a kernel still reads.
    src: DeviceBuffer,
    /// Tensor bytes: cached (`upload`, filled by a copy) or mapped (`mapped`, written by
    /// the kernel).
    output: Option<PinnedBuffer>,
    /// See [`EVENTS`].
    events: [CudaEvent; EVENTS],
    in_flight: Option<InFlight>,
}

struct InFlight {
    out_len: usize,
    host_stage_us: f32,
    /// The fused kernel's encoding (for the message of a failed frame).
    encoding: Encoding,
    /// The tensor goes straight to the caller's pinned memory ([`Target`]), not to the
    /// slot's output buffer.
    direct: bool,
}

/// Where a frame's tensor lands when the caller's buffer is pinned memory of this
/// context: its host address (for the download) and, in `mapped` mode, its device
/// address (the kernel writes it there).
#[derive(Debug, Clone, Copy)]
struct Target {
    host: *mut u8,
    device: Option<CUdeviceptr>,
}

/// A pinned buffer handed out by [`Backend::alloc_host`].
struct PinnedHost(PinnedBuffer);

impl crate::backend::HostMemory for PinnedHost {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the backend uses a buffer it handed out only inside `process_into`,
        // which waits for all GPU work on it before returning (also on errors); so
        // whenever the owner can call this, nothing on the GPU writes it.
        unsafe { self.0.host() }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`: no GPU work on this buffer is pending outside
        // `process_into`.
        unsafe { self.0.host_mut() }
    }
}

/// Bytes of alignment the fused kernel's vector stores need in a destination it writes
/// directly (float4).
const DIRECT_ALIGN: usize = 16;

/// The conv2d weights currently in the conv module's constant memory.
#[derive(PartialEq)]
struct ConvConstants {
    weights: Vec<f32>,
    separable: Option<(Vec<f32>, Vec<f32>)>,
}

/// The CUDA backend. Construct with [`CudaBackend::open`] (as a trait object, what the
/// pipeline uses) or [`CudaBackend::new`].
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    /// Kernels, tables and downloads.
    stream: Arc<CudaStream>,
    /// Frame uploads (and the batch tables): the copy engine, overlapping the kernels.
    copy: Arc<CudaStream>,
    device: DeviceInfo,
    mode: MemoryMode,
    loads: Vec<LoadReport>,
    /// The fused kernel of each encoding (indexed by its code) and its name.
    resize: Vec<CudaFunction>,
    resize_names: Vec<String>,
    /// `resize_normalize_batch`: every slot of a batch in one launch.
    resize_batch: CudaFunction,
    batch: batch::BatchState,
    conv_tiled: Vec<CudaFunction>,
    conv_separable: Vec<CudaFunction>,
    conv_module: Arc<CudaModule>,
    slots: Vec<Slot>,
    next_slot: usize,
    maps_dev: DeviceBuffer,
    scratch: DeviceBuffer,
    out_dev: DeviceBuffer,
    /// The tables in `maps_dev`, and the source size they were checked against.
    maps_for: Option<(AxisMap, AxisMap, u32, u32)>,
    /// Staged-path row words for (encoding, the tables in `maps_dev`).
    row_words: Option<(Encoding, u32)>,
    conv_constants: Option<ConvConstants>,
    /// Test hook (feature `fault-injection`): poison outputs before each frame.
    #[cfg(feature = "fault-injection")]
    poison: bool,
    fused_path: FusedPath,
    /// Resident blocks of the fused kernel for (encoding, row words): its grid size cap.
    resident: Option<(Encoding, u32, u32)>,
    /// Frames whose tensor went straight into the caller's pinned memory.
    direct_frames: u64,
}

impl CudaBackend {
    /// Open device `device_id` as a [`Backend`] (what `select_backend` calls).
    pub fn open(device_id: u32, memory_mode: MemoryMode) -> Result<Box<dyn Backend>> {
        Ok(Box::new(Self::new(device_id, memory_mode)?))
    }

    /// Open device `device_id`: create the context and stream, compile (or load from the
    /// cache) every kernel for the device's compute capability, resolve the memory mode.
    pub fn new(device_id: u32, memory_mode: MemoryMode) -> Result<Self> {
        Self::new_with_cache(device_id, memory_mode, kernels::cache_dir().as_deref())
    }

    /// [`CudaBackend::new`] with an explicit kernel cache directory (`None`: compile
    /// every time, cache nothing).
    pub fn new_with_cache(
        device_id: u32,
        memory_mode: MemoryMode,
        cache: Option<&std::path::Path>,
    ) -> Result<Self> {
        Self::new_with_options(device_id, memory_mode, cache, FusedPath::Direct)
    }

    /// [`CudaBackend::new_with_cache`] choosing how the fused kernel reads packed
    /// encodings (tests and the benchmark exercise both; the node uses the default).
    pub fn new_with_options(
        device_id: u32,
        memory_mode: MemoryMode,
        cache: Option<&std::path::Path>,
        fused_path: FusedPath,
    ) -> Result<Self> {
        // SAFETY: only tries to dlopen libcuda; no symbol is called.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::Unavailable(
                "libcuda.so could not be loaded (no NVIDIA driver on this machine)".into(),
            )
            .into());
        }
        cudarc::driver::result::init()
            .map_err(|e| CudaError::Unavailable(format!("cuInit: {e:?}")))?;
        let count = cudarc::driver::result::device::get_count()
            .map_err(|e| CudaError::Unavailable(format!("cuDeviceGetCount: {e:?}")))?;
        if device_id as i32 >= count {
            return Err(CudaError::Unavailable(format!(
                "device_id {device_id} does not exist: this machine has {count} CUDA device(s)"
            ))
            .into());
        }
        let ctx = CudaContext::new(device_id as usize)
            .map_err(|e| drv_err(format!("creating the context of device {device_id}"), e))?;
        // SAFETY: the backend orders every access to its buffers itself: on the compute
        // stream, or on the copy stream for the frame uploads, which the compute stream
        // waits for through the frame's upload event (and a slot's buffers are reused only
        // after the host waited for its last event). cudarc's cross-stream event tracking
        // is therefore not needed; it is turned off before any allocation is made.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| drv_err("cuStreamCreate(NON_BLOCKING)", e))?;
        let copy = ctx.new_stream().map_err(|e| drv_err("cuStreamCreate(NON_BLOCKING)", e))?;
        let device = device_info(&ctx, device_id)?;
        let mode = match memory_mode {
            MemoryMode::Auto if device.integrated => MemoryMode::Mapped,
            MemoryMode::Auto => MemoryMode::Upload,
            m => m,
        };
        if mode == MemoryMode::Mapped && !device.can_map_host_memory {
            return Err(crate::error::Error::config(
                "memory_mode",
                "mapped",
                format!("{} cannot map host memory; use upload or auto", device.name),
            ));
        }
        if !kernels::nvrtc_available() {
            return Err(CudaError::Unavailable(
                "libnvrtc.so could not be loaded: install the CUDA 12 NVRTC (JetPack, or \
                 PyPI nvidia-cuda-nvrtc-cu12) and put its lib directory on LD_LIBRARY_PATH"
                    .into(),
            )
            .into());
        }
        // Compile (or read from the cache) the kernel files on one thread each, then load.
        let (arch, drv) = (device.arch.clone(), device.driver_version);
        let prepared: Vec<Result<kernels::Prepared, CudaError>> = std::thread::scope(|scope| {
            let jobs: Vec<_> = KernelFile::ALL
                .iter()
                .map(|&file| {
                    let extra = match (file, fused_path) {
                        (KernelFile::ResizeNormalize, FusedPath::Staged) => {
                            vec!["-DRN_STAGED=1".to_string()]
                        }
                        _ => Vec::new(),
                    };
                    let arch = &arch;
                    scope.spawn(move || kernels::prepare(file, arch, drv, cache, &extra))
                })
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err(drv_err("compiling kernels", "a thread panicked")))
                })
                .collect()
        });
        let mut loads = Vec::new();
        let mut modules = Vec::new();
        for p in prepared {
            let (m, report) = kernels::load_prepared(&ctx, p?)?;
            loads.push(report);
            modules.push(m);
        }
        let [rn_module, conv_module] = <[Arc<CudaModule>; 2]>::try_from(modules)
            .map_err(|_| drv_err("loading kernels", "expected two modules"))?;
        let resize_names: Vec<String> =
            Encoding::ALL.iter().map(|&e| resize_normalize_entry(e)).collect();
        let resize = kernels::functions(&rn_module, KernelFile::ResizeNormalize, &resize_names)?;
        let resize_batch = kernels::functions(
            &rn_module,
            KernelFile::ResizeNormalize,
            &[kernels::RESIZE_NORMALIZE_BATCH.to_string()],
        )?
        .into_iter()
        .next()
        .ok_or_else(|| drv_err("loading kernels", "resize_normalize_batch missing"))?;
        let tiled: Vec<String> = CONV_SIZES.iter().map(|k| format!("conv2d_tiled_k{k}")).collect();
        let sep: Vec<String> =
            CONV_SIZES.iter().map(|k| format!("conv2d_separable_k{k}")).collect();
        let conv_tiled = kernels::functions(&conv_module, KernelFile::Conv2dTiled, &tiled)?;
        let conv_separable = kernels::functions(&conv_module, KernelFile::Conv2dTiled, &sep)?;
        let mut slots = Vec::with_capacity(RING);
        for _ in 0..RING {
            let ev = || {
                ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|e| drv_err("cuEventCreate(timing)", e))
            };
            slots.push(Slot {
                input: None,
                src: DeviceBuffer::default(),
                output: None,
                events: [ev()?, ev()?, ev()?, ev()?, ev()?, ev()?],
                in_flight: None,
            });
        }
        Ok(CudaBackend {
            ctx,
            stream,
            copy,
            device,
            mode,
            loads,
            resize,
            resize_names,
            resize_batch,
            batch: batch::BatchState::default(),
            conv_tiled,
            conv_separable,
            conv_module,
            slots,
            next_slot: 0,
            maps_dev: DeviceBuffer::default(),
            scratch: DeviceBuffer::default(),
            out_dev: DeviceBuffer::default(),
            maps_for: None,
            row_words: None,
            conv_constants: None,
            #[cfg(feature = "fault-injection")]
            poison: false,
            fused_path,
            resident: None,
            direct_frames: 0,
        })
    }

    /// The device.
    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// The resolved memory mode (`Upload` or `Mapped`, never `Auto`).
    pub fn memory_mode(&self) -> MemoryMode {
        self.mode
    }

    /// How each kernel module was obtained at start-up (cache hit, compile time, log).
    pub fn load_reports(&self) -> &[LoadReport] {
        &self.loads
    }

    // The parts a frame runs on, for harnesses that time or launch the kernels themselves
    // (the CLI's benchmark): read-only views; every launch goes through `launch_kernel!`.

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The compute stream (kernels, tables, downloads).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The fused kernel of `enc` and its name.
    pub fn fused_kernel(&self, enc: Encoding) -> (&CudaFunction, &str) {
        (&self.resize[enc as usize], &self.resize_names[enc as usize])
    }

    /// The sampling tables of the last frame on the device (`None` before the first frame).
    pub fn tables_device_ptr(&self) -> Option<CUdeviceptr> {
        self.maps_dev.ptr(&self.stream)
    }

    /// Frames processed so far whose tensor went straight into the caller's pinned
    /// memory (`process_into` on a buffer from `alloc_host`), not through a CPU copy.
    pub fn direct_frames(&self) -> u64 {
        self.direct_frames
    }

    /// PCIe rates (GB/s) of one `h2d`-byte upload and one `d2h`-byte download between
    /// pinned host memory and the device, event-timed on the compute stream (median of
    /// 7): the roof of anything that moves those bytes (`vision_preproc bench-batch`).
    pub fn link_rates(&self, h2d: usize, d2h: usize) -> Result<(f64, f64)> {
        use sys::CUevent_flags::CU_EVENT_DEFAULT;
        let e = |err: cudarc::driver::DriverError| drv_err("measuring the PCIe link", err);
        self.ctx.bind_to_thread().map_err(e)?;
        let stream = &self.stream;
        // SAFETY: u8 has no invalid bit patterns; the buffers are only copied from and
        // into, never read as values.
        let host_up = unsafe { self.ctx.alloc_pinned::<u8>(h2d) }.map_err(e)?;
        // SAFETY: as above.
        let mut host_down = unsafe { self.ctx.alloc_pinned::<u8>(d2h) }.map_err(e)?;
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

    /// `out` as a direct destination: pinned host memory of this context (in `mapped`
    /// mode also mapped into the device and aligned for the kernel's stores), else
    /// `None` (the tensor then goes through the slot's own pinned buffer).
    fn direct_target(&self, out: &mut [u8]) -> Option<Target> {
        use sys::CUpointer_attribute as A;
        let host = out.as_mut_ptr();
        let mut memory_type: u32 = 0;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        let mut device: CUdeviceptr = 0;
        let mut attributes = [
            A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            A::CU_POINTER_ATTRIBUTE_CONTEXT,
            A::CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
        ];
        let mut data: [*mut std::ffi::c_void; 3] = [
            (&mut memory_type as *mut u32).cast(),
            (&mut ctx as *mut sys::CUcontext).cast(),
            (&mut device as *mut CUdeviceptr).cast(),
        ];
        // SAFETY: three attributes, each with a valid out pointer of its type (unsigned
        // int, CUcontext, CUdeviceptr). Unlike cuPointerGetAttribute, this call succeeds
        // on memory CUDA does not know (pageable) and leaves the values zero: no error
        // for the driver (or compute-sanitizer) to record.
        let r = unsafe {
            sys::cuPointerGetAttributes(
                attributes.len() as u32,
                attributes.as_mut_ptr(),
                data.as_mut_ptr(),
                host as CUdeviceptr,
            )
        };
        let pinned_here = r == sys::CUresult::CUDA_SUCCESS
            && memory_type == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
            && ctx == self.ctx.cu_ctx();
        match self.mode {
            _ if !pinned_here => None,
            MemoryMode::Mapped if device == 0 || (host as usize) % DIRECT_ALIGN != 0 => None,
            MemoryMode::Mapped => Some(Target { host, device: Some(device) }),
            _ => Some(Target { host, device: None }),
        }
    }

    /// Wait for everything queued on both streams (after an error: nothing may still
    /// write a buffer the caller is about to release). Errors are the failure already
    /// being reported.
    fn synchronize_streams(&self) {
        let _ = self.copy.synchronize();
        let _ = self.stream.synchronize();
    }

    /// Wait for the frame in `slot`, if any, and drop its result.
    fn retire(&mut self, slot: usize) -> Result<(), CudaError> {
        if self.slots[slot].in_flight.take().is_some() {
            self.slots[slot].events[EVENTS - 1]
                .synchronize()
                .map_err(|e| drv_err("waiting for an abandoned frame", e))?;
        }
        Ok(())
    }

    /// Upload the sampling tables when they change (once per frame size), after checking
    /// every index lies inside the source (the kernel trusts them).
    fn ensure_maps(&mut self, op: &PreprocessOp, image: &ImageView<'_>) -> Result<CUdeviceptr> {
        let key_ok = matches!(&self.maps_for, Some((x, y, w, h))
            if *x == op.x_map && *y == op.y_map && *w == image.width() && *h == image.height());
        if key_ok {
            if let Some(p) = self.maps_dev.ptr(&self.stream) {
                return Ok(p);
            }
        }
        let words = map_words(op, image)?;
        let dptr = self.maps_dev.ensure(&self.stream, words.len(), "sampling tables")?;
        // SAFETY: dptr has at least words.len() bytes; the source is pageable, so the call
        // returns only after the bytes have been staged and `words` may then be dropped.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dptr,
                words.as_ptr() as *const _,
                words.len(),
                self.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| drv_err("uploading the sampling tables", e))?;
        self.maps_for = Some((op.x_map.clone(), op.y_map.clone(), image.width(), image.height()));
        self.row_words = None;
        Ok(dptr)
    }

    /// The conv2d launch on the fused output of `p`: its parameters, the kernel for
    /// `c.size` (separable or dense tiled) and its name. `submit` and the benchmark's GPU
    /// frame use it, so both run the same kernel.
    pub fn conv_launch(
        &self,
        p: &PreprocessParams,
        c: &Conv2dOp,
    ) -> (launch::Conv2dParams, &CudaFunction, String) {
        let cp = launch::Conv2dParams {
            width: p.dst_width,
            height: p.dst_height,
            channels: p.channels,
            size: c.size,
            border: c.border,
            layout: p.layout,
            dtype: p.dtype,
            skip: 0,
        };
        let (f, name) = self.conv_kernel(c.size, c.separable.is_some());
        (cp, f, name)
    }

    /// The conv2d kernel of `size` (an odd size 1..=15; another size gets the 1x1 one,
    /// which `Conv2dOp::check` rules out first): `conv2d_separable_k<size>` or
    /// `conv2d_tiled_k<size>`, and its name.
    pub fn conv_kernel(&self, size: u32, separable: bool) -> (&CudaFunction, String) {
        let k = CONV_SIZES.iter().position(|&k| k == size).unwrap_or(0);
        let (f, kind) = match separable {
            true => (&self.conv_separable[k], "conv2d_separable_k"),
            false => (&self.conv_tiled[k], "conv2d_tiled_k"),
        };
        (f, format!("{kind}{}", CONV_SIZES[k]))
    }

    /// Put the conv2d weights (and the separable factors) of `conv` into the conv
    /// module's constant memory, where the conv2d kernels read them, when they change.
    pub fn ensure_conv_constants(&mut self, conv: &Conv2dOp) -> Result<()> {
        let want =
            ConvConstants { weights: conv.weights.clone(), separable: conv.separable.clone() };
        if self.conv_constants.as_ref() == Some(&want) {
            return Ok(());
        }
        let set = |symbol: &str, values: &[f32]| -> Result<(), CudaError> {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut sym = self
                .conv_module
                .get_global(symbol, &self.stream)
                .map_err(|e| drv_err(format!("cuModuleGetGlobal({symbol})"), e))?;
            if bytes.len() > sym.len() {
                return Err(drv_err(format!("setting {symbol}"), "too many weights"));
            }
            let mut dst = sym.slice_mut(..bytes.len());
            self.stream
                .memcpy_htod(&bytes, &mut dst)
                .map_err(|e| drv_err(format!("copying conv2d weights to {symbol}"), e))
        };
        set("c_conv_w", &want.weights)?;
        if let Some((col, row)) = &want.separable {
            set("c_conv_col", col)?;
            set("c_conv_row", row)?;
        }
        self.conv_constants = Some(want);
        Ok(())
    }

    /// Stage `image` and queue its whole frame (upload, preprocess, conv, download) on
    /// the stream; returns the ring slot to pass to [`CudaBackend::finish`]. Blocks only
    /// if that slot's previous frame is still running (more than [`RING`] in flight).
    pub fn submit(
        &mut self,
        image: &ImageView<'_>,
        op: &PreprocessOp,
        conv: Option<&Conv2dOp>,
    ) -> Result<usize> {
        self.submit_to(image, op, conv, None)
    }

    /// [`CudaBackend::submit`], the tensor landing in `target` when given (the caller
    /// keeps it alive and untouched until the slot completes) instead of the slot's
    /// output buffer. A later two-stream overlap (upload of frame N+1 while frame N
    /// computes) keeps this shape: one target per frame in flight.
    fn submit_to(
        &mut self,
        image: &ImageView<'_>,
        op: &PreprocessOp,
        conv: Option<&Conv2dOp>,
        target: Option<Target>,
    ) -> Result<usize> {
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let s = self.next_slot;
        self.next_slot = (s + 1) % RING;
        self.retire(s)?;
        let p = op.params;
        if p.src_width != image.width()
            || p.src_height != image.height()
            || p.encoding != image.encoding() as u32
        {
            return Err(drv_err(
                "checking the operation against the frame",
                format!(
                    "operation built for {}x{} encoding {} but the frame is {}x{} {}",
                    p.src_width,
                    p.src_height,
                    p.encoding,
                    image.width(),
                    image.height(),
                    image.encoding()
                ),
            )
            .into());
        }
        let enc = image.encoding();
        let data = image.data();
        let desc = p.tensor_desc();
        let out_len = desc.byte_len();
        let mapped = self.mode == MemoryMode::Mapped;

        // Host staging into this slot's pinned buffers (nothing of this slot is pending).
        let t = Instant::now();
        let in_kind = if mapped { PinnedKind::Mapped } else { PinnedKind::Upload };
        let out_kind = if mapped { PinnedKind::Mapped } else { PinnedKind::Download };
        let slot = &mut self.slots[s];
        if !slot.input.as_ref().is_some_and(|b| b.len() >= data.len() + SRC_SLACK) {
            slot.input = None;
            slot.input = Some(PinnedBuffer::new(&self.ctx, data.len() + SRC_SLACK, in_kind)?);
        }
        if target.is_none() && !slot.output.as_ref().is_some_and(|b| b.len() >= out_len) {
            slot.output = None;
            slot.output = Some(PinnedBuffer::new(&self.ctx, out_len, out_kind)?);
        }
        let Some(input) = slot.input.as_mut() else {
            return Err(drv_err("staging", "ring slot input buffer missing").into());
        };
        // SAFETY: retire(s) above waited for the last frame that used this slot, and no
        // other frame uses its buffers: no GPU work touching them is pending.
        stage_copy(unsafe { &mut input.host_mut()[..data.len()] }, data);
        let input_host = input.host_ptr();
        let input_dev = input.device_ptr();
        let (output_host, output_dev) = match target {
            Some(t) => {
                #[cfg(feature = "fault-injection")]
                if self.poison && t.device.is_some() {
                    // SAFETY: the caller's buffer has out_len bytes at t.host and no GPU
                    // work on it is pending (process_into waits before returning).
                    unsafe { std::ptr::write_bytes(t.host, 0xFF, out_len) };
                }
                (t.host, t.device)
            }
            None => {
                let Some(output) = slot.output.as_mut() else {
                    return Err(drv_err("staging", "ring slot output buffer missing").into());
                };
                #[cfg(feature = "fault-injection")]
                if self.poison {
                    // SAFETY: as above, nothing pending uses this slot's output buffer.
                    unsafe { output.host_mut().fill(0xFF) };
                }
                (output.host_ptr(), output.device_ptr())
            }
        };
        let host_stage_us = t.elapsed().as_secs_f32() * 1e6;

        let maps = self.ensure_maps(op, image)?;
        let row_words = match self.row_words {
            Some((e, w)) if e == enc => w,
            _ => {
                let w = match self.fused_path {
                    FusedPath::Staged => launch::staged_row_words(&p, &op.x_map, enc),
                    FusedPath::Direct => 0,
                };
                self.row_words = Some((enc, w));
                w
            }
        };
        let stream = self.stream.clone();
        let cu_stream = stream.cu_stream();
        // The upload on the copy stream when another frame is in flight (it overlaps that
        // frame's kernels and download); alone, on the compute stream (a cross-stream wait
        // would only add launch latency).
        let overlap = self.slots.iter().enumerate().any(|(i, x)| i != s && x.in_flight.is_some());
        let up = if overlap { self.copy.clone() } else { stream.clone() };
        let record = |slot: &Slot, i: usize, on: &CudaStream| {
            slot.events[i].record(on).map_err(|e| drv_err("cuEventRecord", e))
        };

        // The upload; on the copy stream, the compute stream waits for its event.
        record(&self.slots[s], 0, &up)?;
        let src = match input_dev {
            Some(d) => d,
            None => {
                let d = self.slots[s].src.ensure(&up, data.len() + SRC_SLACK, "the frame")?;
                // SAFETY: the pinned source holds data.len() staged bytes and stays alive
                // and untouched until this slot's last event completes; d (this slot's
                // own device frame, free: retire(s) waited for its last use) has at least
                // data.len() bytes.
                unsafe {
                    sys::cuMemcpyHtoDAsync_v2(d, input_host as *const _, data.len(), up.cu_stream())
                }
                .result()
                .map_err(|e| drv_err(format!("uploading {} frame bytes", data.len()), e))?;
                d
            }
        };
        record(&self.slots[s], 1, &up)?;
        if overlap {
            stream
                .wait(&self.slots[s].events[1])
                .map_err(|e| drv_err("cuStreamWaitEvent(upload)", e))?;
        }
        record(&self.slots[s], 2, &stream)?;

        // Where the fused kernel writes: the final tensor, or float32 NCHW scratch for conv.
        let mut fp = p;
        let tensor_dst = match output_dev {
            Some(d) => d,
            None => self.out_dev.ensure(&stream, out_len, "the tensor")?,
        };
        let fused_dst = if let Some(c) = conv {
            fp.layout = Layout::Nchw;
            fp.dtype = DType::Float32;
            let d = self.scratch.ensure(&stream, desc.len() * 4, "the conv2d input")?;
            #[cfg(feature = "fault-injection")]
            if self.poison {
                fault::memset(d, desc.len() * 4, cu_stream)?;
            }
            // The invariants the kernels rely on, as the CPU backend checks them.
            c.check()?;
            d
        } else {
            tensor_dst
        };
        #[cfg(feature = "fault-injection")]
        if self.poison && output_dev.is_none() {
            fault::memset(tensor_dst, out_len, cu_stream)?;
        }
        let f = &self.resize[enc as usize];
        let name = &self.resize_names[enc as usize];
        let resident = match self.resident {
            Some((e, w, n)) if e == enc && w == row_words => n,
            _ => {
                let n = resident_blocks(f, row_words, self.device.multiprocessors);
                self.resident = Some((enc, row_words, n));
                n
            }
        };
        launch_kernel!(
            stream,
            f,
            name,
            launch::resize_normalize_cfg(&fp, row_words, resident),
            &fp,
            &src,
            &maps,
            &fused_dst,
            &row_words
        )?;
        record(&self.slots[s], 3, &stream)?;

        if let Some(c) = conv {
            self.ensure_conv_constants(c)?;
            let (cp, f, name) = self.conv_launch(&p, c);
            launch_kernel!(
                stream,
                f,
                name,
                launch::conv_tiled_cfg(p.dst_width, p.dst_height),
                &cp,
                &fused_dst,
                &tensor_dst
            )?;
        }
        record(&self.slots[s], 4, &stream)?;
        if output_dev.is_none() {
            // SAFETY: the pinned output (this slot's or the caller's target) has at least
            // out_len bytes and is not read by the CPU before this slot's last event
            // completes (finish/retire, or process_into's wait).
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(output_host as *mut _, tensor_dst, out_len, cu_stream)
            }
            .result()
            .map_err(|e| drv_err(format!("downloading {out_len} tensor bytes"), e))?;
        }
        record(&self.slots[s], 5, &stream)?;
        self.slots[s].in_flight =
            Some(InFlight { out_len, host_stage_us, encoding: enc, direct: target.is_some() });
        Ok(s)
    }

    /// Wait for the frame queued in `slot` by [`CudaBackend::submit`], copy its tensor into
    /// `out` and return its stage times (events; the upload and download times include
    /// the CPU copies into and out of the pinned buffers).
    pub fn finish(&mut self, slot: usize, out: &mut Vec<u8>) -> Result<StageTimes> {
        let len = self.slots.get(slot).and_then(|s| s.in_flight.as_ref()).map_or(0, |f| f.out_len);
        out.resize(len, 0);
        self.finish_into(slot, Some(out))
    }

    /// Wait for `slot`; copy its tensor into `out` (exactly its length) unless it went
    /// to a direct target (then `out` is `None`).
    fn finish_into(&mut self, slot: usize, out: Option<&mut [u8]>) -> Result<StageTimes> {
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let s = self
            .slots
            .get_mut(slot)
            .ok_or_else(|| drv_err("finish", format!("no ring slot {slot}")))?;
        let f = s
            .in_flight
            .take()
            .ok_or_else(|| drv_err("finish", format!("no frame in slot {slot}")))?;
        s.events[EVENTS - 1].synchronize().map_err(|e| {
            let kernel = resize_normalize_entry(f.encoding);
            drv_err(format!("running the frame (upload, {kernel}, conv, download)"), e)
        })?;
        let ms = |a: usize, b: usize| {
            s.events[a].elapsed_ms(&s.events[b]).map_err(|e| drv_err("cuEventElapsedTime", e))
        };
        let (up, pre, conv, down) = (ms(0, 1)?, ms(2, 3)?, ms(3, 4)?, ms(4, 5)?);
        let t = Instant::now();
        match (f.direct, out) {
            (true, None) => {}
            (false, Some(out)) if out.len() == f.out_len => {
                let output =
                    s.output.as_ref().ok_or_else(|| drv_err("finish", "slot output missing"))?;
                // SAFETY: the slot's last event has completed: nothing writes this buffer.
                out.copy_from_slice(unsafe { &output.host()[..f.out_len] });
            }
            _ => {
                return Err(drv_err(
                    "finish",
                    "the destination does not match how the frame was submitted",
                )
                .into())
            }
        }
        let host_out_us = t.elapsed().as_secs_f32() * 1e6;
        Ok(StageTimes {
            upload_us: f.host_stage_us + up * 1e3,
            preprocess_us: pre * 1e3,
            conv_us: conv * 1e3,
            download_us: down * 1e3 + host_out_us,
        })
    }
}

/// The sampling tables of `op` as the kernel reads them (x then y: i0 | i1 | w1 bits),
/// after checking every index lies inside `image` and the content rectangle inside the
/// network image (the kernel trusts them).
fn map_words(op: &PreprocessOp, image: &ImageView<'_>) -> Result<Vec<u8>> {
    let p = &op.params;
    let (xm, ym) = (&op.x_map, &op.y_map);
    let lens_ok =
        [xm.i0.len(), xm.i1.len(), xm.w1.len()].iter().all(|&n| n == p.content_w as usize)
            && [ym.i0.len(), ym.i1.len(), ym.w1.len()].iter().all(|&n| n == p.content_h as usize);
    let in_range = |v: &[i32], n: u32| v.iter().all(|&i| i >= 0 && (i as u32) < n);
    let inside = p.content_x.checked_add(p.content_w).is_some_and(|e| e <= p.dst_width)
        && p.content_y.checked_add(p.content_h).is_some_and(|e| e <= p.dst_height);
    if !lens_ok
        || !inside
        || !in_range(&xm.i0, image.width())
        || !in_range(&xm.i1, image.width())
        || !in_range(&ym.i0, image.height())
        || !in_range(&ym.i1, image.height())
    {
        return Err(drv_err(
            "checking the sampling tables",
            "tables do not match the content rectangle or point outside the source image",
        )
        .into());
    }
    let mut words: Vec<u8> = Vec::with_capacity(12 * (xm.i0.len() + ym.i0.len()));
    for m in [xm, ym] {
        words.extend(m.i0.iter().flat_map(|v| v.to_le_bytes()));
        words.extend(m.i1.iter().flat_map(|v| v.to_le_bytes()));
        words.extend(m.w1.iter().flat_map(|v| v.to_le_bytes()));
    }
    Ok(words)
}

/// Frames at least this large are copied into the pinned staging buffer by several
/// threads: one core writes write-combined memory at a fraction of what the memory
/// system takes (a 6.2 MB 1080p frame is most of the upload stage otherwise).
pub const PARALLEL_STAGING_MIN: usize = 1 << 20;
/// Threads of that copy. Measured on the H200 machine's host (bench/memcpy_rate.py
/// --pinned, 6.2 MB pageable -> pinned write-combined): 10.6 GB/s on 1 thread, 13.3 on
/// 2, 21.7 on 4, 12.1 on 8; rayon's 16 threads in 512 KB pieces reached ~10 GB/s in the
/// node (upload stage 0.74 ms at 1080p, of which 0.12 ms is the H2D copy).
pub const STAGING_THREADS: usize = 4;

/// The one copy of a frame on its way to the GPU: from the received message into the
/// pinned staging buffer (in [`STAGING_THREADS`] pieces for large frames).
fn stage_copy(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    let threads = STAGING_THREADS.min(rayon::current_num_threads());
    if src.len() < PARALLEL_STAGING_MIN || threads < 2 {
        dst.copy_from_slice(src);
        return;
    }
    let piece = src.len().div_ceil(threads).next_multiple_of(64);
    dst.par_chunks_mut(piece)
        .zip(src.par_chunks(piece))
        .with_max_len(1)
        .for_each(|(d, s)| d.copy_from_slice(s));
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

fn device_info(ctx: &Arc<CudaContext>, ordinal: u32) -> Result<DeviceInfo, CudaError> {
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

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_description(&self) -> String {
        let d = &self.device;
        format!(
            "{} ({}, {} SMs, {}, driver {}.{}, NVRTC {}.{}, memory_mode {})",
            d.name,
            d.arch,
            d.multiprocessors,
            if d.integrated { "integrated" } else { "discrete" },
            d.driver_version / 1000,
            (d.driver_version % 1000) / 10,
            d.nvrtc_version.0,
            d.nvrtc_version.1,
            match self.mode {
                MemoryMode::Mapped => "mapped",
                _ => "upload",
            }
        )
    }

    fn diagnostics(&self) -> Vec<(String, String)> {
        let d = &self.device;
        let mode = match self.mode {
            MemoryMode::Mapped => "mapped",
            _ => "upload",
        };
        vec![
            ("GPU".to_string(), d.name.clone()),
            ("GPU compute capability".to_string(), d.arch.clone()),
            // The driver API reports the peak clock; the current (DVFS) clock needs NVML,
            // which the node does not load.
            (
                "GPU max SM clock (MHz)".to_string(),
                d.max_sm_clock_mhz.map_or_else(|| "unknown".to_string(), |c| format!("{c:.0}")),
            ),
            ("GPU memory mode".to_string(), mode.to_string()),
        ]
    }

    fn process_into(
        &mut self,
        image: &ImageView<'_>,
        op: &PreprocessOp,
        conv: Option<&Conv2dOp>,
        out: &mut [u8],
    ) -> Result<StageTimes> {
        crate::backend::check_out_len(op, out)?;
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let Some(target) = self.direct_target(out) else {
            let result = self.submit(image, op, conv);
            let result = result.and_then(|slot| self.finish_into(slot, Some(out)));
            if result.is_err() {
                // Work queued before the error may still read the slot's buffers.
                self.synchronize_streams();
            }
            return result;
        };
        let result = self.submit_to(image, op, conv, Some(target));
        let result = result.and_then(|slot| self.finish_into(slot, None));
        self.direct_frames += u64::from(result.is_ok());
        if result.is_err() {
            // Work queued before the error may still write `out`: wait for the streams
            // (their own error, if any, is the same failure) before `out` is released.
            self.synchronize_streams();
            for slot in &mut self.slots {
                if slot.in_flight.as_ref().is_some_and(|f| f.direct) {
                    slot.in_flight = None;
                }
            }
        }
        result
    }

    /// One launch of `resize_normalize_batch` for the whole batch, one conv2d launch
    /// over it (see `batch.rs`).
    fn process_batch_into(
        &mut self,
        slots: &[crate::backend::BatchSlot<'_, '_>],
        conv: Option<&Conv2dOp>,
        out: &mut [u8],
    ) -> Result<StageTimes> {
        self.batch_into(slots, conv, out)
    }

    fn alloc_host(&mut self, len: usize) -> Result<crate::backend::HostBuffer> {
        let kind =
            if self.mode == MemoryMode::Mapped { PinnedKind::Mapped } else { PinnedKind::Download };
        let buf = PinnedBuffer::new(&self.ctx, len, kind)?;
        Ok(crate::backend::HostBuffer::new(Box::new(PinnedHost(buf))))
    }

    /// Test hook (feature `fault-injection`): a real device fault (see `fault.rs`).
    #[cfg(feature = "fault-injection")]
    fn inject_fault(&mut self, kind: crate::backend::FaultKind) -> crate::Error {
        fault::inject(self, kind)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // The pinned ring may still be read or written by queued work: wait for it before
        // the fields (and their memory) are dropped.
        let _ = self.ctx.bind_to_thread();
        let r = self.copy.synchronize();
        self.ctx.record_err(r);
        let r = self.stream.synchronize();
        self.ctx.record_err(r);
    }
}
