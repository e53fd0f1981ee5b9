//! The CUDA backend itself: [`CudaBackend`], the parts it owns (the context and streams,
//! the kernels, the ring of entries, what the frame and the batch paths keep, the JPEG
//! decoder), its constructors, the read-only views harnesses use, and [`Backend`]:
//! every job goes through [`Backend::submit_to`] to the one submission (`steps.rs`).

use super::device::{self, DeviceInfo};
use super::driver::drv_err;
use super::entry::{Ring, RING};
use super::kernel_set::{self, BackendKernels};
use super::kernels::{self, LoadReport};
use super::launch::{self, FusedPath};
use super::memory::{PinnedBuffer, PinnedHost, PinnedKind};
use super::nvjpeg::JpegDecoder;
use super::steps::{self, Gpu, Source, Target, Work};
use super::{batch, frame, vmm};
use crate::backend::{
    Backend, BatchWork, Conv2dOp, Frame, FrameWork, Job, Out, PreprocessParams, Queued, StageTimes,
};
use crate::config::MemoryMode;
use crate::error::{CudaError, Error, Result};
use crate::image::Encoding;
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use std::collections::VecDeque;
use std::sync::Arc;

/// The CUDA backend. Construct with [`CudaBackend::open`] (as a trait object, what the
/// pipeline uses) or [`CudaBackend::new`].
pub struct CudaBackend {
    /// The context, the streams and the device memory the steps share. First: its drop
    /// waits for both streams before any other part (and its memory) is dropped.
    gpu: Gpu,
    device: DeviceInfo,
    /// Every function it launches, and the conv2d weights in constant memory.
    kernels: BackendKernels,
    /// The entries submissions are staged into, frames and batches alike.
    ring: Ring,
    /// What the frame path keeps from frame to frame.
    frame: frame::FrameState,
    /// What the batch path keeps from batch to batch.
    batch: batch::BatchState,
    /// Submissions of [`Backend::submit_to`] in flight, oldest first.
    queue: VecDeque<Submission>,
    /// Where JPEG frames are decoded: nvJPEG on the device, or the host when it is not
    /// available.
    jpeg: JpegDecoder,
}

/// A [`Backend::submit_to`] in flight: its ring entry and where its tensors go.
struct Submission {
    /// Its ring entry.
    entry: usize,
    /// A single frame (not a batch).
    frame: bool,
    /// The caller's host memory, if any (valid and untouched until the submission is
    /// finished or abandoned: `submit_to`'s contract).
    host: Option<*mut u8>,
    len: usize,
    direct: bool,
    /// Time its compressed frames took to decode before it was staged.
    decode_us: f32,
}

// SAFETY: `host` is only a destination the caller keeps alive for the backend (the
// contract of `Backend::submit_to`); the backend, and so the pointer, is used by one
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
        let jpeg = JpegDecoder::open(&ctx);
        let kernels = kernel_set::load_backend(
            &ctx,
            &device.arch,
            device.driver_version,
            cache,
            fused_path == FusedPath::Staged,
        )?;
        Ok(CudaBackend {
            frame: frame::FrameState::new(fused_path, device.multiprocessors),
            batch: batch::BatchState::default(),
            ring: Ring::new(&ctx)?,
            gpu: Gpu::new(ctx, mode)?,
            device,
            kernels,
            queue: VecDeque::new(),
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
        self.kernels.fused(enc)
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
    /// `c.size` (separable or dense tiled) and its name. A submission and the benchmark's
    /// GPU frame use it, so both run the same kernel.
    pub fn conv_launch(
        &self,
        p: &PreprocessParams,
        c: &Conv2dOp,
    ) -> (launch::Conv2dParams, &CudaFunction, String) {
        self.kernels.conv_launch(p, c)
    }

    /// The conv2d kernel of `size` (an odd size 1..=15; another size gets the 1x1 one,
    /// which `Conv2dOp::check` rules out first): `conv2d_separable_k<size>` or
    /// `conv2d_tiled_k<size>`, and its name.
    pub fn conv_kernel(&self, size: u32, separable: bool) -> (&CudaFunction, String) {
        self.kernels.conv_kernel(size, separable)
    }

    /// Put the conv2d weights (and the separable factors) of `conv` into the conv
    /// module's constant memory, where the conv2d kernels read them, when they change.
    pub fn ensure_conv_constants(&mut self, conv: &Conv2dOp) -> Result<()> {
        self.kernels.ensure_conv_constants(&self.gpu.stream, conv)
    }

    /// PCIe rates (GB/s) of one `h2d`-byte upload and one `d2h`-byte download between
    /// pinned host memory and the device (`device::link_rates`).
    pub fn link_rates(&self, h2d: usize, d2h: usize) -> Result<(f64, f64)> {
        device::link_rates(&self.gpu, h2d, d2h)
    }

    /// Submissions of [`Backend::submit_to`] in flight (not yet finished).
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Test hook (feature `fault-injection`): fill every output and scratch buffer with
    /// NaN bytes (0xFF) before each frame, so an element the kernels fail to write shows
    /// up as NaN.
    #[cfg(feature = "fault-injection")]
    pub fn set_poison_outputs(&mut self, on: bool) {
        self.gpu.poison = on;
    }

    /// `job` submitted and finished with nothing else in flight (`process_into`,
    /// `process_batch_into`): the synchronous form of the one path.
    fn run_alone(&mut self, job: Job<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
        if !self.queue.is_empty() {
            let why = "submissions of submit_to are not finished: finish_oldest them first";
            return Err(Error::misuse("process_into", why));
        }
        // SAFETY: `out` is borrowed for this whole call, and the submission is finished
        // (or abandoned on error) before it returns.
        match unsafe { self.submit_into(job, out.as_mut_ptr(), out.len()) }? {
            Queued::Done(times) => Ok(times),
            Queued::Pending => self.finish_oldest(),
        }
    }

    /// [`Backend::submit_to`] of a job whose frames are all pixels (or JPEGs nvJPEG
    /// takes): checked, then the one submission (`steps::submit_entry`) on a free ring
    /// entry. A job that fails its checks (an operation that does not fit its frame), or
    /// comes while [`RING`] submissions are in flight (`Misuse`), is refused before
    /// anything is queued and the submissions in flight stay; after a JPEG nvJPEG refused
    /// they stay too (what this one queued is waited for); after any other error every
    /// submission in flight is abandoned (both streams waited for).
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
            let why = format!("{} submissions already in flight: finish_oldest one first", RING);
            return Err(Error::misuse("submit_to", why));
        }
        self.gpu.bind()?;
        // Only the addresses are kept: the caller keeps them valid and untouched until
        // the submission is finished or abandoned (the contract).
        let target = self.gpu.target(out);
        let frame = matches!(job, Job::Frame(_));
        // SAFETY: the caller's promise, passed on.
        let entry = unsafe { self.submit_job(job, target) }.and_then(|r| self.after(r, out));
        let entry = match entry {
            Ok(r) => r,
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
        self.queue.push_back(Submission { entry, frame, host, len, direct, decode_us: 0.0 });
        Ok(Queued::Pending)
    }

    /// The checked `job` on a free ring entry, its tensors to `target` (else the entry's
    /// output): the frame's or the batch's [`steps::Launch`] through the one submission.
    /// Returns the entry.
    ///
    /// # Safety
    /// `target` is the caller's memory, alive and untouched until the entry completes.
    unsafe fn submit_job(&mut self, job: Job<'_, '_>, target: Option<Target>) -> Result<usize> {
        let conv = match job {
            Job::Frame(w) => w.conv,
            Job::Batch(w) => w.conv,
        };
        if let Some(c) = conv {
            self.kernels.ensure_conv_constants(&self.gpu.stream, c)?;
        }
        let overlap = self.ring.busy();
        let r = self.ring.take()?;
        let (gpu, e, jpeg) = (&mut self.gpu, self.ring.entry(r), &mut self.jpeg);
        match job {
            Job::Frame(FrameWork { image, op, conv }) => {
                let p = op.params;
                let frames = [Some(Source::of(image)?)];
                let w = Work {
                    frames: &frames,
                    target,
                    len: p.tensor_desc().byte_len(),
                    conv_input: conv.map(|_| p.tensor_desc().len()),
                    encoding: Some(image.encoding()),
                };
                let k = &self.kernels;
                let mut l = frame::FrameLaunch::new(k, &mut self.frame, op, image.encoding(), conv);
                // SAFETY: the entry is free (`Ring::take`); `target` is the caller's.
                unsafe { steps::submit_entry(gpu, e, jpeg, overlap, w, &mut l) }?;
            }
            Job::Batch(BatchWork { slots, conv }) => {
                let (p0, n) = (slots[0].op.params, slots.len());
                let frames: Vec<Option<Source<'_>>> = slots
                    .iter()
                    .map(|s| s.image.map(Source::of).transpose())
                    .collect::<Result<_>>()?;
                let w = Work {
                    frames: &frames,
                    target,
                    len: p0.tensor_desc().byte_len() * n,
                    conv_input: conv.map(|_| p0.tensor_desc().len() * n),
                    encoding: None,
                };
                let (k, mp) = (&self.kernels, self.device.multiprocessors);
                let mut l = batch::BatchLaunch::new(k, &mut self.batch, mp, slots, conv);
                // SAFETY: the entry is free (`Ring::take`); `target` is the caller's.
                unsafe { steps::submit_entry(gpu, e, jpeg, overlap, w, &mut l) }?;
            }
        }
        Ok(r)
    }

    /// After a submission's GPU work is queued: the test hook's fault inside it
    /// (`FaultKind::InFlight`), then a shared block's interprocess event, after its last
    /// write (its download too, when the `tensor` message wants the bytes).
    fn after(&mut self, entry: usize, out: Out) -> Result<usize> {
        #[cfg(feature = "fault-injection")]
        if std::mem::take(&mut self.gpu.fault_armed) {
            super::fault::queue_illegal_address(&self.gpu, &self.kernels)?;
        }
        if let Out::Device { ready: Some(event), .. } = out {
            // SAFETY: an event of this context (the pool's blocks were made by this
            // backend), alive as long as the pool; the stream is ours.
            let r =
                unsafe { sys::cuEventRecord(event as sys::CUevent, self.gpu.stream.cu_stream()) };
            r.result().map_err(|e| drv_err("cuEventRecord (a shared block's event)", e))?;
        }
        Ok(entry)
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

    fn device_context(&self) -> Option<crate::image::DeviceContext> {
        let ctx = &self.gpu.ctx;
        Some(crate::image::DeviceContext {
            handle: ctx.cu_ctx() as usize,
            device: ctx.cu_device(),
            keep: ctx.clone(),
        })
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
            (crate::backend::DECODER_KEY.to_string(), self.jpeg.describe()),
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
        RING
    }

    /// nvJPEG's hardware decoder readied for sets of 1 to `frames` JPEGs
    /// ([`NvJpeg::warm_up`](super::nvjpeg::NvJpeg::warm_up)); nothing when JPEGs are
    /// decoded on the host.
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
            return Err(Error::misuse("finish_oldest", "nothing in flight: submit_to first"));
        };
        // SAFETY: `host` is the caller's, valid and untouched until this returns (the
        // contract of submit_to); the submission's last event is waited for before the
        // CPU copies into it.
        let out = sub.host.map(|h| unsafe { std::slice::from_raw_parts_mut(h, sub.len) });
        let result = (self.gpu.bind().map_err(Into::into))
            .and_then(|()| self.ring.entry(sub.entry).finish(out).map(|(t, _)| t));
        match result {
            Ok(times) => {
                self.frame.direct_frames += u64::from(sub.direct && sub.frame);
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
        self.ring.abandon();
    }

    fn alloc_host(&mut self, len: usize) -> Result<crate::backend::HostBuffer> {
        let kind = self.gpu.pinned_kind(PinnedKind::Download);
        let buf = PinnedBuffer::new(&self.gpu.ctx, len, kind)?;
        Ok(crate::backend::HostBuffer::new(Box::new(PinnedHost(buf))))
    }

    /// Test hook (feature `fault-injection`): a real device fault (see `fault.rs`).
    #[cfg(feature = "fault-injection")]
    fn inject_fault(&mut self, kind: crate::backend::FaultKind) -> crate::Error {
        super::fault::inject(&self.gpu, &self.kernels, kind)
    }

    #[cfg(feature = "fault-injection")]
    fn arm_in_flight_fault(&mut self) -> bool {
        self.gpu.fault_armed = true;
        true
    }
}
