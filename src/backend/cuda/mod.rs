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
//! Files: `steps.rs` the steps every submission runs (stage -> upload -> launch ->
//! download, finish); `frame.rs` one frame, `batch.rs` N frames in one launch, both
//! through those steps; `kernels.rs` compiling and loading, `launch.rs` launch shapes and
//! the kernels' `#[repr(C)]` structs, `memory.rs` pinned and device buffers, `device.rs`
//! what is known of the GPU; `fault.rs` the test hooks.
//!
//! Everything the GPU touches stays allocated across frames and grows only when a frame
//! needs more. Every kernel is compiled for the device's own architecture at start-up
//! (cached on disk), so a bad kernel fails the node at boot, not on its first frame.
//! Errors: an operation that does not fit its frame, or a buffer of the wrong size, is
//! the caller's mistake (`Error::Operation`, checked before anything is queued); only
//! what the driver reports is `Error::Cuda`, which the pipeline's `gpu_failure_policy`
//! acts on.

mod batch;
mod device;
pub(crate) mod driver;
#[cfg(feature = "fault-injection")]
mod fault;
mod fnv;
mod frame;
pub mod kernels;
pub mod launch;
pub mod memory;
pub mod nvjpeg;
mod registry;
mod steps;
pub(crate) mod vmm;

pub(crate) use batch::BATCH_RING;
pub use device::{resident_blocks, DeviceInfo};

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
pub use launch::MAX_BATCH_SLOTS;

use crate::backend::{
    Backend, BatchWork, Conv2dOp, Frame, FrameWork, Job, Out, PreprocessParams, Queued, StageTimes,
};
use crate::compressed::{Codec, Compressed};
use crate::config::MemoryMode;
use crate::error::{CudaError, Error, Result};
use crate::image::Encoding;
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use driver::drv_err;
use kernels::{LoadReport, CONV_SIZES};
use memory::{PinnedBuffer, PinnedHost, PinnedKind};
use std::sync::Arc;

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

/// The CUDA backend. Construct with [`CudaBackend::open`] (as a trait object, what the
/// pipeline uses) or [`CudaBackend::new`].
pub struct CudaBackend {
    /// The context, the streams and the device memory the steps share.
    gpu: steps::Gpu,
    device: DeviceInfo,
    /// Every function it launches.
    kernels: kernels::BackendKernels,
    /// The conv2d whose weights (and separable factors) are in the conv module's
    /// constant memory.
    conv_constants: Option<Conv2dOp>,
    fused_path: FusedPath,
    /// The ring and caches of the single-frame path.
    frame: frame::FrameState,
    /// The ring and caches of the batch path.
    batch: batch::BatchState,
    /// Submissions of [`Backend::submit_into`] in flight, oldest first.
    queue: std::collections::VecDeque<Submission>,
    /// Where JPEG frames are decoded: nvJPEG on the device, or the host when it is not
    /// available.
    jpeg: JpegDecoder,
}

/// Where the backend decodes JPEG frames.
pub(crate) enum JpegDecoder {
    /// nvJPEG, into the device buffer the fused kernel reads (`steps.rs`, decode).
    Gpu(Box<nvjpeg::NvJpeg>),
    /// On the host, as PNG (the CPU decoder, then staged and uploaded): nvJPEG could not
    /// be opened, and why.
    Host(String),
}

impl JpegDecoder {
    /// nvJPEG, `Misuse` when it is not available (the frame should have been decoded on
    /// the host: [`JpegDecoder::takes`] said no).
    pub(crate) fn gpu(&mut self) -> Result<&mut nvjpeg::NvJpeg> {
        match self {
            JpegDecoder::Gpu(nv) => Ok(nv),
            JpegDecoder::Host(why) => Err(Error::misuse(
                "decoding a JPEG on the device",
                format!("nvJPEG is not available ({why}): the frame is decoded on the host"),
            )),
        }
    }

    /// Whether `c` is decoded on the device: a JPEG whose header nvJPEG reads as the
    /// header check did (else the host decodes it, or refuses it with the CPU decoder's
    /// reason). An MJPEG frame without Huffman tables is read, and staged, with the
    /// standard ones (`compressed::jpeg_pieces`).
    fn takes(&self, c: &Compressed<'_>) -> bool {
        match self {
            JpegDecoder::Gpu(nv) => {
                c.codec() == Codec::Jpeg && {
                    let jpeg = crate::compressed::with_standard_huffman_tables(c.data());
                    nv.accepts(&jpeg, c.width(), c.height(), c.encoding() == Encoding::Mono8)
                }
            }
            JpegDecoder::Host(_) => false,
        }
    }
}

/// A [`Backend::submit_into`] in flight: its ring entry and where its tensors go.
struct Submission {
    /// `Some(entry)` of the frame ring, `None`: the oldest batch of the batch ring.
    frame: Option<usize>,
    /// The caller's host memory, if any (valid and untouched until the submission is
    /// finished or abandoned: `submit_to`'s contract).
    host: Option<*mut u8>,
    len: usize,
    direct: bool,
    /// Time its compressed frames took to decode before it was staged.
    decode_us: f32,
}

// SAFETY: `out` is only a destination the caller keeps alive for the backend (the
// contract of `Backend::submit_into`); the backend, and so the pointer, is used by one
// thread at a time (`&mut self`).
unsafe impl Send for Submission {}

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
        // stream, or on the copy stream for the uploads, which the compute stream waits
        // for through the submission's upload event (and a ring entry's buffers are
        // reused only after its last event completed). cudarc's cross-stream event
        // tracking is therefore not needed; it is turned off before any allocation.
        unsafe { ctx.disable_event_tracking() };
        let device = device::device_info(&ctx, device_id)?;
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
        // nvJPEG (optional: without it JPEG frames are decoded on the host).
        let jpeg = match nvjpeg::NvJpeg::open(&ctx) {
            Ok(nv) => JpegDecoder::Gpu(Box::new(nv)),
            Err(e) => JpegDecoder::Host(e.to_string()),
        };
        let kernels = kernels::load_backend(
            &ctx,
            &device.arch,
            device.driver_version,
            cache,
            fused_path == FusedPath::Staged,
        )?;
        Ok(CudaBackend {
            frame: frame::FrameState::new(&ctx)?,
            batch: batch::BatchState::new(&ctx)?,
            gpu: steps::Gpu::new(ctx, mode)?,
            device,
            kernels,
            conv_constants: None,
            fused_path,
            queue: std::collections::VecDeque::new(),
            jpeg,
        })
    }

    /// The device.
    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// The resolved memory mode (`Upload` or `Mapped`, never `Auto`).
    pub fn memory_mode(&self) -> MemoryMode {
        self.gpu.mode
    }

    /// How each kernel module was obtained at start-up (cache hit, compile time, log).
    pub fn load_reports(&self) -> &[LoadReport] {
        &self.kernels.loads
    }

    // The parts a frame runs on, for harnesses that time or launch the kernels themselves
    // (the CLI's benchmark): read-only views; every launch goes through `launch_kernel!`.

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.gpu.ctx
    }

    /// The compute stream (kernels, tables, downloads).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.gpu.stream
    }

    /// The fused kernel of `enc` and its name.
    pub fn fused_kernel(&self, enc: Encoding) -> (&CudaFunction, &str) {
        (&self.kernels.resize[enc as usize], &self.kernels.resize_names[enc as usize])
    }

    /// The sampling tables of the last frame on the device (`None` before the first frame).
    pub fn tables_device_ptr(&self) -> Option<CUdeviceptr> {
        self.frame.tables.ptr(&self.gpu.stream)
    }

    /// Frames processed so far whose tensor went straight into the caller's memory (pinned
    /// host memory from `alloc_host`, or a shared device block), not through a CPU copy.
    pub fn direct_frames(&self) -> u64 {
        self.frame.direct_frames
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
            true => (&self.kernels.conv_separable[k], "conv2d_separable_k"),
            false => (&self.kernels.conv_tiled[k], "conv2d_tiled_k"),
        };
        (f, format!("{kind}{}", CONV_SIZES[k]))
    }

    /// Put the conv2d weights (and the separable factors) of `conv` into the conv
    /// module's constant memory, where the conv2d kernels read them, when they change.
    pub fn ensure_conv_constants(&mut self, conv: &Conv2dOp) -> Result<()> {
        let same = |c: &Conv2dOp| c.weights == conv.weights && c.separable == conv.separable;
        if self.conv_constants.as_ref().is_some_and(same) {
            return Ok(());
        }
        let set = |symbol: &str, values: &[f32]| -> Result<()> {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut sym = self
                .kernels
                .conv_module
                .get_global(symbol, &self.gpu.stream)
                .map_err(|e| drv_err(format!("cuModuleGetGlobal({symbol})"), e))?;
            if bytes.len() > sym.len() {
                return Err(Error::misuse(
                    format!("setting {symbol}"),
                    format!(
                        "{} bytes of conv2d weights do not fit its {} bytes (a Conv2dOp larger \
                         than conv.size allows: build it with Conv2dOp::new)",
                        bytes.len(),
                        sym.len()
                    ),
                ));
            }
            let mut dst = sym.slice_mut(..bytes.len());
            self.gpu
                .stream
                .memcpy_htod(&bytes, &mut dst)
                .map_err(|e| drv_err(format!("copying conv2d weights to {symbol}"), e).into())
        };
        set("c_conv_w", &conv.weights)?;
        if let Some((col, row)) = &conv.separable {
            set("c_conv_col", col)?;
            set("c_conv_row", row)?;
        }
        self.conv_constants = Some(conv.clone());
        Ok(())
    }
}

impl CudaBackend {
    /// Where compressed frames are decoded, and the JPEG frames nvJPEG decoded so far by
    /// each of its decoders (`/diagnostics`, `vision_preproc info`).
    fn decoders(&self) -> String {
        let host = crate::backend::HOST_DECODERS;
        match &self.jpeg {
            JpegDecoder::Gpu(nv) => {
                let c = nv.counts();
                let hybrid: Vec<String> =
                    c.hybrid.iter().map(|(why, n)| format!("{n} {}", why.describe())).collect();
                format!(
                    "JPEG on the GPU: {} (decoded: {} by the hardware decoder{}{}); PNG, and a \
                     JPEG whose header nvJPEG does not read, on the host ({host}), then staged \
                     and uploaded like raw frames",
                    nv.describe(),
                    c.hardware,
                    if hybrid.is_empty() { "" } else { "; " },
                    hybrid.join("; ")
                )
            }
            JpegDecoder::Host(why) => format!(
                "on the host ({host}), then staged and uploaded like raw frames; no JPEG \
                 decoding on the GPU: {why}"
            ),
        }
    }

    /// `job` submitted and finished with nothing else in flight (`process_into`,
    /// `process_batch_into`): the synchronous form of the one path.
    fn run_alone(&mut self, job: Job<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
        if !self.queue.is_empty() || self.batches_in_flight() > 0 {
            let why =
                "submissions of submit_into or submit_batch are not finished: finish them first";
            return Err(Error::misuse("process_into", why));
        }
        // SAFETY: `out` is borrowed for this whole call, and the submission is finished
        // (or abandoned on error) before it returns.
        match unsafe { self.submit_into(job, out.as_mut_ptr(), out.len()) }? {
            Queued::Done(times) => Ok(times),
            Queued::Pending => self.finish_oldest(),
        }
    }

    /// [`Backend::submit_to`] of a job whose frames are all pixels.
    ///
    /// # Safety
    /// As [`Backend::submit_to`].
    unsafe fn submit_pixels(&mut self, job: Job<'_, '_>, out: Out) -> Result<Queued> {
        let len = out.len();
        match job {
            Job::Frame(FrameWork { image, op, conv }) => {
                crate::backend::check_out_len(op, len)?;
                frame::check(image, op, conv)?;
            }
            Job::Batch(BatchWork { slots, conv }) => {
                crate::backend::check_batch_len(slots, len)?;
                batch::check(slots, conv)?;
            }
        }
        if self.queue.len() >= self.max_in_flight() {
            let why =
                format!("{} submissions already in flight: finish one first", self.queue.len());
            return Err(crate::Error::Operation(format!("submit_into: {why}")));
        }
        self.gpu.bind()?;
        // Only the addresses are kept: the caller keeps them valid and untouched until
        // the submission is finished or abandoned (the contract).
        let target = self.gpu.target(out);
        let frame = match job {
            Job::Frame(FrameWork { image, op, conv }) => {
                self.frame_submit(image, op, conv, target).map(Some)
            }
            Job::Batch(BatchWork { slots, conv }) => {
                self.batch_submit(slots, conv, target).map(|()| None)
            }
        };
        // Test hook: a fault inside this submission's GPU work (`FaultKind::InFlight`).
        #[cfg(feature = "fault-injection")]
        let frame = match frame {
            Ok(f) if std::mem::take(&mut self.gpu.fault_armed) => {
                fault::queue_illegal_address(self).map(|()| f).map_err(Into::into)
            }
            other => other,
        };
        // A shared block's interprocess event, after the submission's last write (its
        // download too, when the `tensor` message wants the bytes).
        let frame = frame.and_then(|f| match out {
            Out::Device { ready: Some(event), .. } => {
                // SAFETY: an event of this context (the pool's blocks were made by this
                // backend), alive as long as the pool; the stream is ours.
                let r = unsafe {
                    sys::cuEventRecord(event as sys::CUevent, self.gpu.stream.cu_stream())
                };
                r.result().map_err(|e| drv_err("cuEventRecord (a shared block's event)", e))?;
                Ok(f)
            }
            _ => Ok(f),
        });
        let frame = match frame {
            Ok(f) => f,
            // A JPEG that nvJPEG refused (a bad frame, not a device failure): the
            // submissions in flight stay; what this one queued is waited for.
            Err(e @ Error::Decode(_)) => {
                self.gpu.synchronize();
                return Err(e);
            }
            Err(e) => {
                self.abandon_all();
                return Err(e);
            }
        };
        let host = match out {
            Out::Host { ptr, .. } => Some(ptr),
            Out::Device { host, .. } => host,
        };
        let direct = target.is_some_and(|t| t.direct());
        self.queue.push_back(Submission { frame, host, len, direct, decode_us: 0.0 });
        Ok(Queued::Pending)
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_description(&self) -> String {
        let d = &self.device;
        format!(
            "{} ({}, {} SMs, {}, driver {}.{}, NVRTC {}.{}, memory_mode {}, JPEG: {})",
            d.name,
            d.arch,
            d.multiprocessors,
            if d.integrated { "integrated" } else { "discrete" },
            d.driver_version / 1000,
            (d.driver_version % 1000) / 10,
            d.nvrtc_version.0,
            d.nvrtc_version.1,
            self.gpu.mode_name(),
            match &self.jpeg {
                JpegDecoder::Gpu(nv) => nv.summary(),
                JpegDecoder::Host(_) => "on the host (nvJPEG unavailable)".to_string(),
            }
        )
    }

    fn diagnostics(&self) -> Vec<(String, String)> {
        let d = &self.device;
        vec![
            ("GPU".to_string(), d.name.clone()),
            ("GPU compute capability".to_string(), d.arch.clone()),
            // The driver API reports the peak clock; the current (DVFS) clock needs NVML,
            // which the node does not load.
            (
                "GPU max SM clock (MHz)".to_string(),
                d.max_sm_clock_mhz.map_or_else(|| "unknown".to_string(), |c| format!("{c:.0}")),
            ),
            ("GPU memory mode".to_string(), self.gpu.mode_name().to_string()),
            (
                "GPU in-process frames".to_string(),
                if self.gpu.registry.supported() {
                    "read in place: a `gst:` input's buffers of system memory are registered \
                     with the driver once (no host copy)"
                } else {
                    "copied once into the pinned staging buffer: this device cannot register \
                     host memory"
                }
                .to_string(),
            ),
            (
                "GPU kernels".to_string(),
                self.kernels
                    .loads
                    .iter()
                    .map(|l| l.describe(&d.arch))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            (crate::backend::DECODER_KEY.to_string(), self.decoders()),
        ]
    }

    /// One launch of the fused kernel of the frame's encoding, one conv2d launch (see
    /// `frame.rs`), the tensor straight into `out` when it is pinned memory of this
    /// context: [`Backend::submit_into`] and [`Backend::finish_oldest`] with nothing else
    /// in flight.
    fn process_into(&mut self, work: FrameWork<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
        self.run_alone(Job::Frame(work), out)
    }

    /// One launch of `resize_normalize_batch` for the whole batch, one conv2d launch
    /// over it (see `batch.rs`), the tensors straight into `out` when it is pinned memory
    /// of this context; as [`Backend::process_into`].
    fn process_batch_into(&mut self, w: BatchWork<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
        self.run_alone(Job::Batch(w), out)
    }

    fn max_in_flight(&self) -> usize {
        frame::RING.min(BATCH_RING)
    }

    /// nvJPEG's hardware decoder readied for sets of 1 to `frames` JPEGs
    /// ([`nvjpeg::NvJpeg::warm_up`]); nothing when JPEGs are decoded on the host.
    fn prepare_decoding(&mut self, frames: usize) -> Result<()> {
        match &mut self.jpeg {
            JpegDecoder::Gpu(nv) => nv.warm_up(&self.gpu.stream, frames),
            JpegDecoder::Host(_) => Ok(()),
        }
    }

    /// The frame (`frame.rs`) or the batch (`batch.rs`) staged, uploaded (on the copy
    /// stream when another submission is in flight) and queued; the tensors straight
    /// into `out` when it is pinned memory of this context or device memory (a shared
    /// block: with a download to its host copy, if any), else through the entry's
    /// pinned output and one CPU copy at [`Backend::finish_oldest`].
    unsafe fn submit_to(&mut self, job: Job<'_, '_>, out: Out) -> Result<Queued> {
        // JPEG frames whose header nvJPEG reads are staged compressed and decoded on the
        // device (steps.rs); other compressed frames (PNG, or every one when nvJPEG is not
        // available) are decoded on the host (the CPU decoder), then staged and uploaded
        // as pixels. The host decoding's time is the submission's `decode_us` (with the
        // device decoding's, from its events, at the finish).
        let on_device: Vec<bool> = crate::backend::job_frames(&job)
            .iter()
            .map(|f| matches!(f, Some(Frame::Compressed(c)) if self.jpeg.takes(c)))
            .collect();
        let (queued, decode_us) =
            crate::backend::with_host_pixels_except(job, &on_device, |job| {
                // SAFETY: the caller's promise, passed on.
                unsafe { self.submit_pixels(job, out) }
            })?;
        if let Some(last) = self.queue.back_mut() {
            last.decode_us = decode_us;
        }
        Ok(queued)
    }

    fn shared_blocks(
        &self,
        count: usize,
        bytes: usize,
    ) -> Result<Option<Box<dyn crate::handoff::DeviceBlocks>>> {
        let blocks = vmm::VmmBlocks::new(&self.gpu.ctx, &self.device, count, bytes)?;
        Ok(Some(Box::new(blocks)))
    }

    fn finish_oldest(&mut self) -> Result<StageTimes> {
        let Some(sub) = self.queue.pop_front() else {
            return Err(crate::Error::Operation("finish_oldest: nothing in flight".into()));
        };
        // SAFETY: `host` is the caller's, valid and untouched until this returns (the
        // contract of submit_to); the submission's last event is waited for before the
        // CPU copies into it.
        let out = sub.host.map(|h| unsafe { std::slice::from_raw_parts_mut(h, sub.len) });
        let result = self.gpu.bind().map_err(Into::into).and_then(|()| match sub.frame {
            Some(s) => self.frame.ring[s].finish(out).map(|(t, _)| t),
            None => self.batch_finish(out).map(|(t, ..)| t),
        });
        match result {
            Ok(times) => {
                self.frame.direct_frames += u64::from(sub.direct && sub.frame.is_some());
                Ok(StageTimes { decode_us: sub.decode_us + times.decode_us, ..times })
            }
            Err(e) => {
                self.abandon_all();
                Err(e)
            }
        }
    }

    fn abandon_all(&mut self) {
        let _ = self.gpu.bind();
        self.gpu.synchronize();
        self.queue.clear();
        for e in &mut self.frame.ring {
            e.in_flight = None;
        }
        self.batch.abandon();
    }

    fn alloc_host(&mut self, len: usize) -> Result<crate::backend::HostBuffer> {
        let kind = self.gpu.pinned_kind(PinnedKind::Download);
        let buf = PinnedBuffer::new(&self.gpu.ctx, len, kind)?;
        Ok(crate::backend::HostBuffer::new(Box::new(PinnedHost(buf))))
    }

    /// Test hook (feature `fault-injection`): a real device fault (see `fault.rs`).
    #[cfg(feature = "fault-injection")]
    fn inject_fault(&mut self, kind: crate::backend::FaultKind) -> crate::Error {
        fault::inject(self, kind)
    }

    #[cfg(feature = "fault-injection")]
    fn arm_in_flight_fault(&mut self) -> bool {
        self.gpu.fault_armed = true;
        true
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // The pinned ring may still be read or written by queued work: wait for it before
        // the fields (and their memory) are dropped.
        let g = &self.gpu;
        let _ = g.bind();
        g.ctx.record_err(g.copy.synchronize());
        g.ctx.record_err(g.stream.synchronize());
    }
}
