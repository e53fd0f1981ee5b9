//! The steps of a submission, shared by the single frame (`frame.rs`) and the batch
//! (`batch.rs`): **stage** (the sampling tables to the device when they change; each
//! frame into its ring entry's pinned buffer, the one CPU copy, unless it lies in lent
//! memory the driver registered (`registry.rs`): then nothing; a JPEG frame's compressed
//! bytes) -> **decode** (JPEG frames only: nvJPEG, all of the submission's in one call,
//! into the device buffer the kernels read, on the upload's stream, inside the `upload`
//! NVTX range; `StageTimes::decode_us`) -> **upload** (on the copy stream when another
//! submission is in flight, else on the compute stream; nothing in `mapped` mode) ->
//! **launch** (the path's fused kernel, then conv2d) -> **download**
//! (into the caller's pinned memory or the entry's own; nothing when the kernels wrote it
//! in place), with a timing event between the steps; then **finish** (wait, stage times,
//! the copy out). A ring entry is staged into only once its previous submission completed.
//! Each step runs inside its NVTX range (`stage-in`, `upload`, `preprocess`, `conv`,
//! `download`: `crate::nvtx`), each kernel launch inside its own stage's only.

use super::driver::drv_err;
use super::entry::{decode_jpegs, Entry, InFlight, Staging, CONVOLVED, DONE, PREPROCESSED};
use super::kernel_set::ConvStep;
use super::memory::{DeviceBuffer, PinnedBuffer, PinnedKind, SRC_SLACK};
use super::nvjpeg::JpegDecoder;
use super::registry::Registry;
use crate::backend::{Frame, Out};
use crate::compressed::{Codec, Compressed};
use crate::config::MemoryMode;
use crate::error::{CudaError, Error, Result};
use crate::image::{DeviceMemory, Encoding, Lent};
use crate::launch_kernel;
use crate::nvtx::{self, Stage};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::Arc;
use std::time::Instant;

/// Frames at least this large are copied into the pinned staging buffer by several
/// threads: one core writes write-combined memory at a fraction of what the memory
/// system takes (a 6.2 MB 1080p frame is most of the upload stage otherwise).
pub(crate) const PARALLEL_STAGING_MIN: usize = 1 << 20;
/// Threads of that copy. Measured on the H200 machine's host (bench/memcpy_rate.py
/// --pinned, 6.2 MB pageable -> pinned write-combined): 10.6 GB/s on 1 thread, 13.3 on
/// 2, 21.7 on 4, 12.1 on 8; rayon's 16 threads in 512 KB pieces reached ~10 GB/s in the
/// node (upload stage 0.74 ms at 1080p, of which 0.12 ms is the H2D copy).
pub(crate) const STAGING_THREADS: usize = 4;

/// The context, the two streams, and the device memory every submission shares (used
/// only on the compute stream, so in submission order): what the steps run on.
pub(super) struct Gpu {
    pub ctx: Arc<CudaContext>,
    /// Kernels, sampling tables and downloads.
    pub stream: Arc<CudaStream>,
    /// Uploads while another submission is in flight: the copy engine, overlapping it.
    pub copy: Arc<CudaStream>,
    /// `Upload` or `Mapped`, never `Auto`.
    pub mode: MemoryMode,
    /// The tensor(s) on the device, when the kernels do not write host memory in place.
    tensor: DeviceBuffer,
    /// The fused kernel's float32 NCHW output: conv2d's input.
    scratch: DeviceBuffer,
    /// Lent host memory registered with the driver: frames read in place.
    pub registry: Registry,
    /// Test hook (feature `fault-injection`): poison the outputs of every submission.
    #[cfg(feature = "fault-injection")]
    pub poison: bool,
    /// Test hook (feature `fault-injection`): the next submission faults after its
    /// kernels (`FaultKind::InFlight`).
    #[cfg(feature = "fault-injection")]
    pub fault_armed: bool,
}

/// Where a submission's tensor lands, when not in the ring entry's own output.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// The caller's pinned host memory of this context: the kernels write the device
    /// tensor, then it is downloaded there.
    Host(*mut u8),
    /// The caller's mapped host memory (`mapped` mode): the kernels write it in place at
    /// this device address.
    Mapped(*mut u8, CUdeviceptr),
    /// Device memory (a shared block): the kernels write it there; then it is
    /// downloaded to `copy`'s host memory, if any.
    Device(CUdeviceptr, DeviceCopy),
}

/// Where the tensor in a [`Target::Device`] is also copied.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DeviceCopy {
    /// Nowhere.
    None,
    /// Downloaded to the caller's pinned host memory.
    To(*mut u8),
    /// Downloaded to the ring entry's output, then copied into the caller's (pageable)
    /// host memory at the finish.
    ViaEntry,
}

impl Target {
    /// The tensor reaches the caller's memory with no copy at the finish.
    pub(crate) fn direct(&self) -> bool {
        !matches!(self, Target::Device(_, DeviceCopy::ViaEntry))
    }
}

/// Where the kernels write a submission's tensor(s): in place (mapped host memory) or
/// on the device, then downloaded to `download_to`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Destination {
    /// The device address the kernels write.
    pub tensor: CUdeviceptr,
    download_to: Option<*mut u8>,
}

/// Bytes of alignment the fused kernel's vector stores need in a destination it writes
/// directly (float4).
const DIRECT_ALIGN: usize = 16;

impl Gpu {
    pub(super) fn new(ctx: Arc<CudaContext>, mode: MemoryMode) -> Result<Self, CudaError> {
        let stream = ctx.new_stream().map_err(|e| drv_err("cuStreamCreate(NON_BLOCKING)", e))?;
        let copy = ctx.new_stream().map_err(|e| drv_err("cuStreamCreate(NON_BLOCKING)", e))?;
        let register = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED;
        // Unknown (an old driver): as not supported, frames are copied.
        let supported = ctx.attribute(register).is_ok_and(|v| v != 0);
        Ok(Gpu {
            registry: Registry::new(ctx.clone(), supported, mode == MemoryMode::Mapped),
            ctx,
            stream,
            copy,
            mode,
            tensor: DeviceBuffer::default(),
            scratch: DeviceBuffer::default(),
            #[cfg(feature = "fault-injection")]
            poison: false,
            #[cfg(feature = "fault-injection")]
            fault_armed: false,
        })
    }

    /// The memory mode's parameter value.
    pub(super) fn mode_name(&self) -> &'static str {
        if self.mode == MemoryMode::Mapped {
            "mapped"
        } else {
            "upload"
        }
    }

    /// `kind`, or in `mapped` mode `Mapped` (the kernels use the memory in place).
    pub(super) fn pinned_kind(&self, kind: PinnedKind) -> PinnedKind {
        if self.mode == MemoryMode::Mapped {
            PinnedKind::Mapped
        } else {
            kind
        }
    }

    /// Make the context current on this thread.
    pub(super) fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))
    }

    /// The stream of a submission's upload: the copy stream when another submission is
    /// in flight (the upload then overlaps its kernels and download); alone, the compute
    /// stream itself: a cross-stream wait would only add the kernels' launch latency
    /// (~5 us on the H200) with nothing to overlap.
    pub(super) fn upload_stream(&self, overlap: bool) -> Arc<CudaStream> {
        let up = if overlap { &self.copy } else { &self.stream };
        up.clone()
    }

    /// Wait for everything queued on both streams (after an error: nothing may still
    /// write a buffer the caller is about to release). Errors are the failure already
    /// being reported.
    pub(super) fn synchronize(&self) {
        let _ = self.copy.synchronize();
        let _ = self.stream.synchronize();
    }

    /// Where a submission's tensors go: the caller's host memory as a direct destination
    /// when it is pinned memory of this context (in `mapped` mode also mapped into the
    /// device and aligned for the kernel's stores), else `None` (through the entry's own
    /// pinned buffer and one CPU copy); device memory always (the host copy beside it
    /// direct, or through the entry when that memory is not pinned).
    pub(super) fn target(&self, out: Out) -> Option<Target> {
        match out {
            Out::Host { ptr, .. } => self.host_target(ptr),
            Out::Device { ptr, host: None, .. } => Some(Target::Device(ptr, DeviceCopy::None)),
            Out::Device { ptr, host: Some(h), .. } => Some(Target::Device(
                ptr,
                if self.host_target(h).is_some() {
                    DeviceCopy::To(h)
                } else {
                    DeviceCopy::ViaEntry
                },
            )),
        }
    }

    /// `host` as a direct destination (see [`Gpu::target`]).
    fn host_target(&self, host: *mut u8) -> Option<Target> {
        use sys::CUpointer_attribute as A;
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
            MemoryMode::Mapped if device == 0 || !(host as usize).is_multiple_of(DIRECT_ALIGN) => {
                None
            }
            MemoryMode::Mapped => Some(Target::Mapped(host, device)),
            _ => Some(Target::Host(host)),
        }
    }

    /// Stage: each frame (`None`: a padded slot, nothing) into its pinned buffer, grown
    /// to the frame plus [`SRC_SLACK`] when needed (write-combined in `upload` mode,
    /// mapped in `mapped` mode): the one CPU copy of a frame. A frame in device memory is
    /// neither copied nor uploaded (checked: [`Gpu::check_device`]; counted in its
    /// source's `LentReads::on_device`). A frame in lent memory
    /// that the [`Registry`] takes is not copied: it is read in place (counted in its
    /// source's `LentReads`, as is a lent frame copied). A JPEG's compressed bytes go
    /// to the slot's cached pinned buffer instead (nvJPEG reads them on the host, which
    /// write-combined memory makes slow). All frames at once, each in [`STAGING_THREADS`]
    /// pieces when large: one after the other would leave most of the host's memory
    /// bandwidth unused, as N single-camera processes would not.
    ///
    /// # Safety
    /// No GPU work that uses these buffers may be pending (their ring entry is free).
    pub(super) unsafe fn stage(
        &mut self,
        into: &mut [Staging],
        frames: &[Option<Source<'_>>],
    ) -> Result<()> {
        self.registry.forget_freed();
        let mut copies: Vec<(&mut [u8], &[u8])> = Vec::with_capacity(frames.len());
        for (staging, frame) in into.iter_mut().zip(frames) {
            staging.in_place = None;
            let Some(source) = *frame else { continue };
            if let Source::Device(memory) = source {
                self.check_device(memory)?;
                memory.count_read();
                continue;
            }
            if let Source::Pixels(data, Some(lent)) = source {
                match self.registry.in_place(data, lent, SRC_SLACK) {
                    Ok(frame) => {
                        lent.count_read(Ok(()));
                        staging.in_place = Some(frame);
                        continue;
                    }
                    Err(why) => lent.count_read(Err((why.kind(), why.to_string()))),
                }
            }
            let len = source.staged_len();
            let (slot, kind) = match source {
                Source::Pixels(..) | Source::Device(_) => {
                    (&mut staging.host, self.pinned_kind(PinnedKind::Upload))
                }
                Source::Jpeg(_) => {
                    (&mut staging.compressed, self.pinned_kind(PinnedKind::Download))
                }
            };
            let buf = reserve(&self.ctx, slot, len + SRC_SLACK, kind)?;
            // SAFETY: no GPU work uses the buffer (the precondition); each staging has its
            // own buffers, so the slices do not overlap.
            let host = unsafe { &mut buf.host_mut()[..len] };
            match source {
                Source::Pixels(data, _) => copies.push((host, data)),
                Source::Device(_) => {}
                // A JPEG is small: here, piece by piece (with the standard Huffman tables
                // put in when it has none).
                Source::Jpeg(c) => {
                    let mut at = 0;
                    for piece in crate::compressed::jpeg_pieces(c.data()) {
                        host[at..at + piece.len()].copy_from_slice(piece);
                        at += piece.len();
                    }
                }
            }
        }
        if let [(dst, src)] = &mut copies[..] {
            // One frame: on this thread, no hand-off to the pool.
            parallel_copy(dst, src);
        } else {
            use rayon::prelude::*;
            copies.into_par_iter().with_max_len(1).for_each(|(d, s)| parallel_copy(d, s));
        }
        Ok(())
    }

    /// A frame in device memory can be read in place by the kernels: it belongs to this
    /// backend's context (GStreamer's CUDA context wraps it: `capture::GpuShare`), and its
    /// memory starts and ends on 8-byte boundaries (the fused kernel's aligned 8-byte
    /// reads, up to 7 bytes past the last byte it needs, stay inside it). Else an
    /// operation error naming the cause, never a device failure.
    fn check_device(&self, memory: &DeviceMemory) -> Result<()> {
        if memory.context() != self.ctx.cu_ctx() as usize {
            return Err(Error::Operation(format!(
                "a frame in device memory of another CUDA context ({:#x}, the backend's is \
                 {:#x}): GStreamer's CUDA elements must share the node's context",
                memory.context(),
                self.ctx.cu_ctx() as usize
            )));
        }
        let end = memory.ptr().checked_add(memory.len() as u64);
        if !memory.ptr().is_multiple_of(8) || !end.is_some_and(|e| e.is_multiple_of(8)) {
            return Err(Error::Operation(format!(
                "a frame in device memory at {:#x} of {} bytes: the kernels read it in place \
                 only on 8-byte boundaries",
                memory.ptr(),
                memory.len()
            )));
        }
        Ok(())
    }

    /// Where the kernels write `len` bytes of tensor(s): the caller's `target`, else the
    /// entry's `output` (grown when needed: cached pinned memory the download fills, or
    /// in `mapped` mode mapped memory the kernels write in place); on the device first
    /// unless it is written in place. Poisoned when the test hook asks.
    ///
    /// # Safety
    /// No GPU work that uses `output` (its ring entry is free) or the `len` bytes of
    /// `target` may be pending, and `target` stays alive and untouched by the CPU until
    /// the submission completes.
    pub(super) unsafe fn destination(
        &mut self,
        output: &mut Option<PinnedBuffer>,
        target: Option<Target>,
        len: usize,
    ) -> Result<Destination> {
        let entry = |output: &mut Option<PinnedBuffer>| {
            reserve(&self.ctx, output, len, self.pinned_kind(PinnedKind::Download))
                .map(|o| (o.host_ptr(), o.device_ptr()))
        };
        // The device address the kernels write, the host memory downloaded into, and the
        // host memory they write in place (mapped).
        let (tensor, download_to, in_place) = match target {
            Some(Target::Device(d, DeviceCopy::None)) => (Some(d), None, None),
            Some(Target::Device(d, DeviceCopy::To(h))) => (Some(d), Some(h), None),
            Some(Target::Device(d, DeviceCopy::ViaEntry)) => {
                (Some(d), Some(entry(output)?.0), None)
            }
            Some(Target::Mapped(h, d)) => (Some(d), None, Some(h)),
            Some(Target::Host(h)) => (None, Some(h), None),
            None => match entry(output)? {
                (h, Some(d)) => (Some(d), None, Some(h)),
                (h, None) => (None, Some(h), None),
            },
        };
        let tensor = match tensor {
            Some(t) => t,
            None => self.tensor.ensure(&self.stream, len, "the tensor")?,
        };
        let dst = Destination { tensor, download_to };
        #[cfg(feature = "fault-injection")]
        if self.poison {
            match in_place {
                // SAFETY: `host` has `len` bytes no GPU work uses (the precondition).
                Some(host) => unsafe { std::ptr::write_bytes(host, 0xFF, len) },
                None => super::fault::memset(dst.tensor, len, self.stream.cu_stream())?,
            }
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = in_place;
        Ok(dst)
    }

    /// conv2d's input: `elements` float32 values on the device (poisoned when the test
    /// hook asks).
    pub(super) fn conv_input(&mut self, elements: usize) -> Result<CUdeviceptr> {
        let d = self.scratch.ensure(&self.stream, elements * 4, "the conv2d input")?;
        #[cfg(feature = "fault-injection")]
        if self.poison {
            super::fault::memset(d, elements * 4, self.stream.cu_stream())?;
        }
        Ok(d)
    }

    /// Download: `len` bytes of `dst` to its host memory on the compute stream, unless
    /// the kernels wrote them there in place.
    fn download(&self, dst: Destination, len: usize) -> Result<(), CudaError> {
        let Some(host) = dst.download_to else { return Ok(()) };
        // SAFETY: `host` (the caller's target or the entry's output) has `len` bytes
        // that stay alive and unread until the submission's last event completes
        // (`destination`'s contract); `dst.tensor` holds `len` bytes on the device.
        unsafe { sys::cuMemcpyDtoHAsync_v2(host.cast(), dst.tensor, len, self.stream.cu_stream()) }
            .result()
            .map_err(|e| drv_err(format!("downloading {len} tensor bytes"), e))
    }
}

/// A pinned buffer of at least `len` bytes of `kind` in `slot`, allocated when missing
/// or too small (the old one freed first).
fn reserve<'a>(
    ctx: &Arc<CudaContext>,
    slot: &'a mut Option<PinnedBuffer>,
    len: usize,
    kind: PinnedKind,
) -> Result<&'a mut PinnedBuffer> {
    if slot.as_ref().is_none_or(|b| b.len() < len) {
        *slot = None;
        *slot = Some(PinnedBuffer::new(ctx, len, kind)?);
    }
    slot.as_mut().ok_or_else(|| Error::misuse("staging", "pinned buffer missing after allocation"))
}

/// `dst = src` (equal lengths), in [`STAGING_THREADS`] pieces when large: the copies
/// into and out of pinned memory.
pub(super) fn parallel_copy(dst: &mut [u8], src: &[u8]) {
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

/// A frame as the steps take it: pixel rows, staged and uploaded; or a JPEG, whose
/// compressed bytes are staged (pinned, alive until the submission completes) and decoded
/// on the device by nvJPEG into the buffer the kernels read, in both memory modes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source<'s> {
    /// Pixel rows (an `ImageView`'s bytes), and the memory they lie in when lent.
    Pixels(&'s [u8], Option<&'s Lent>),
    /// A probed JPEG (decoded to tight rows of its `step`).
    Jpeg(&'s Compressed<'s>),
    /// Pixel rows already in device memory (a hardware decoder's): nothing is staged or
    /// uploaded, the kernels read them where they are.
    Device(&'s DeviceMemory),
}

impl<'s> Source<'s> {
    /// `frame` as a source: pixels, or a JPEG for the device decoder. Any other compressed
    /// frame (PNG) is the caller's to decode on the host first.
    pub(crate) fn of<'a: 's>(frame: Frame<'a, 's>) -> Result<Source<'s>> {
        match frame {
            Frame::Pixels(v) => Ok(Source::Pixels(v.data(), v.lent())),
            Frame::Compressed(c) if c.codec() == Codec::Jpeg => Ok(Source::Jpeg(c)),
            Frame::Device(d) => Ok(Source::Device(d.memory())),
            Frame::Compressed(c) => Err(Error::misuse(
                "staging a frame",
                format!(
                    "a {} frame reached the device steps: decode it on the host first",
                    c.codec()
                ),
            )),
        }
    }

    /// The bytes staged: the pixels, or the compressed JPEG (with the standard Huffman
    /// tables when it has none: `compressed::jpeg_pieces`).
    pub(crate) fn staged_len(&self) -> usize {
        match *self {
            Source::Pixels(d, _) => d.len(),
            Source::Device(_) => 0,
            Source::Jpeg(c) => {
                crate::compressed::jpeg_pieces(c.data()).iter().map(|p| p.len()).sum()
            }
        }
    }
}

/// What a frame and a batch do differently in a submission (`frame.rs`, `batch.rs`):
/// their sampling tables, what else the fused kernel reads, the fused kernel and its
/// launch, conv2d's launch. [`submit_entry`] runs everything else.
pub(super) trait Launch {
    /// Stage step: the frames' sampling tables on the device (on the compute stream,
    /// before the upload).
    fn tables(&mut self, stream: &Arc<CudaStream>) -> Result<()>;

    /// Upload step, after the frames: anything else the fused kernel reads (the batch's
    /// slot table), staged into `e` and uploaded on `up`.
    ///
    /// # Safety
    /// As [`submit_entry`].
    unsafe fn upload(
        &mut self,
        gpu: &mut Gpu,
        e: &mut Entry,
        up: &Arc<CudaStream>,
        on: &OnDevice,
    ) -> Result<()> {
        let _ = (gpu, e, up, on);
        Ok(())
    }

    /// Launch step: the fused kernel on `stream`.
    fn fused(&self, stream: &Arc<CudaStream>, on: &OnDevice) -> Result<()>;

    /// The conv2d step, when configured (its input is `on.scratch`).
    fn conv(&self, on: &OnDevice) -> Option<ConvStep<'_>>;
}

/// Where a submission's data lies on the device after its upload.
pub(super) struct OnDevice {
    /// Each frame's pixels as the kernels read them (`None`: a padded slot).
    pub frames: Vec<Option<CUdeviceptr>>,
    /// The tensor(s) the kernels write.
    pub tensor: CUdeviceptr,
    /// conv2d's input, when configured: the fused kernel's float32 NCHW output.
    pub scratch: Option<CUdeviceptr>,
}

/// One checked submission: its frames (`None`: a padded slot), where its `len` bytes of
/// tensor(s) go (the caller's memory, else the entry's output), conv2d's input elements
/// when configured, and the frame's encoding (`None`: a batch).
pub(super) struct Work<'a, 's> {
    pub frames: &'a [Option<Source<'s>>],
    pub target: Option<Target>,
    pub len: usize,
    pub conv_input: Option<usize>,
    pub encoding: Option<Encoding>,
}

/// Stage -> decode -> upload -> launch -> download of one checked submission `w` on ring
/// entry `e`, a frame or a batch alike (`launch` says what differs); on the copy stream
/// when `overlap` (another submission is in flight). Leaves the entry in flight.
///
/// # Safety
/// The entry is free (its previous submission completed, or was abandoned after both
/// streams were waited for) and no other submission uses its buffers; `w.target` is the
/// caller's memory, alive and untouched until the entry completes.
pub(super) unsafe fn submit_entry(
    gpu: &mut Gpu,
    e: &mut Entry,
    jpeg: &mut JpegDecoder,
    overlap: bool,
    w: Work<'_, '_>,
    launch: &mut dyn Launch,
) -> Result<()> {
    let up = gpu.upload_stream(overlap);
    // Stage: the tables, then every frame at once.
    let stage_in = nvtx::stage(Stage::StageIn);
    launch.tables(&gpu.stream)?;
    let t = Instant::now();
    e.inputs.resize_with(w.frames.len().max(e.inputs.len()), Default::default);
    // SAFETY: the entry is free (the precondition); `target` is the caller's promise.
    let dst = unsafe {
        gpu.stage(&mut e.inputs, w.frames)?;
        gpu.destination(&mut e.output, w.target, w.len)?
    };
    let host_us = t.elapsed().as_secs_f32() * 1e6;
    drop(stage_in);
    let scratch = w.conv_input.map(|n| gpu.conv_input(n)).transpose()?;

    // Decode: every JPEG in one nvJPEG call. Then upload: the other frames, then what
    // else the kernels read.
    let upload = nvtx::stage(Stage::Upload);
    let jpegs: Vec<(usize, &Compressed<'_>)> = (w.frames.iter().enumerate())
        .filter_map(|(i, f)| match f {
            Some(Source::Jpeg(c)) => Some((i, *c)),
            _ => None,
        })
        .collect();
    // Frames in device memory: read where they are.
    let mut frames: Vec<Option<CUdeviceptr>> = (w.frames.iter())
        .map(|f| match f {
            Some(Source::Device(m)) => Some(m.ptr()),
            _ => None,
        })
        .collect();
    if !jpegs.is_empty() {
        // SAFETY: as above; the entry is not reused before its last event.
        let dsts = unsafe { decode_jpegs(jpeg.gpu()?, e, &up, &jpegs) }?;
        for (&(i, _), d) in jpegs.iter().zip(dsts) {
            frames[i] = Some(d);
        }
    }
    e.begin_upload(&up)?;
    for (i, source) in w.frames.iter().enumerate() {
        let Some(source) = source.filter(|_| frames[i].is_none()) else { continue };
        let what = match w.encoding {
            Some(_) => "the frame".to_string(),
            None => format!("the frame of slot {i}"),
        };
        // SAFETY: as above; the entry is not reused before its last event.
        frames[i] = Some(unsafe { e.inputs[i].upload(source.staged_len(), &up, &what)? });
    }
    let on = OnDevice { frames, tensor: dst.tensor, scratch };
    // SAFETY: as above.
    unsafe { launch.upload(gpu, e, &up, &on)? };
    e.end_upload(&up, &gpu.stream)?;
    drop(upload);

    launch_and_download(gpu, e, launch, &on, dst, w.len)?;
    let direct = w.target.is_some_and(|t| t.direct());
    let decoded = !jpegs.is_empty();
    e.in_flight = Some(InFlight { len: w.len, host_us, direct, encoding: w.encoding, decoded });
    Ok(())
}

/// Launch -> download on entry `e`: the fused kernel, conv2d when configured, the
/// download of `len` bytes to `dst`, with the events between them.
fn launch_and_download(
    gpu: &Gpu,
    e: &Entry,
    launch: &dyn Launch,
    on: &OnDevice,
    dst: Destination,
    len: usize,
) -> Result<()> {
    let stream = &gpu.stream;
    // Each launch inside its stage's range and no other: Nsight Compute's NVTX filter
    // (`--nvtx-include "preprocess/"`) then selects exactly that stage's kernels.
    nvtx::stage(Stage::Preprocess).scope(|| launch.fused(stream, on))?;
    e.record(PREPROCESSED, stream)?;
    if let Some(c) = launch.conv(on) {
        let _range = nvtx::stage(Stage::Conv);
        launch_kernel!(stream, c.f, c.name, c.cfg, &c.params, &c.src, &dst.tensor)?;
    }
    e.record(CONVOLVED, stream)?;
    let _range = nvtx::stage(Stage::Download);
    gpu.download(dst, len)?;
    e.record(DONE, stream)?;
    Ok(())
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // The pinned ring may still be read or written by queued work: wait for it before
        // the backend's parts (and their memory) are dropped. `Gpu` is the backend's first
        // field, so this runs before any other part is dropped.
        let _ = self.bind();
        self.ctx.record_err(self.copy.synchronize());
        self.ctx.record_err(self.stream.synchronize());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compressed::Limits;

    /// A PNG reaching the device steps (they stage pixels and JPEGs; the host decodes a
    /// PNG first): a misuse of the steps, never a device failure; reachable without a GPU.
    #[test]
    fn a_png_at_the_device_steps_is_a_misuse() {
        let img = image::DynamicImage::ImageRgb8(image::RgbImage::new(4, 2));
        let mut png = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
        let c = Compressed::probe("png", &png, &Limits::default()).unwrap();
        let e = Source::of(Frame::from(&c)).unwrap_err();
        assert!(matches!(e, Error::Misuse { .. }), "{e:?}");
        assert!(!e.is_device_failure());
        assert!(e.to_string().contains("decode it on the host first"), "{e}");
    }
}
