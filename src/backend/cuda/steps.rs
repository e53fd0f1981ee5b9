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
use super::kernels::{resize_normalize_entry, RESIZE_NORMALIZE_BATCH};
use super::launch::{self, Conv2dParams};
use super::memory::{DeviceBuffer, PinnedBuffer, PinnedKind, SRC_SLACK};
use super::nvjpeg::{DecodeItem, NvJpeg};
use super::registry::{InPlace, Registry};
use super::{launch_kernel, CudaBackend};
use crate::backend::{AxisMap, Conv2dOp, Frame, Out, PreprocessOp, PreprocessParams, StageTimes};
use crate::compressed::{Codec, Compressed};
use crate::config::MemoryMode;
use crate::error::{CudaError, Error, Result};
use crate::image::{Encoding, Lent};
use crate::nvtx::{self, Stage};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig};
use std::sync::Arc;
use std::time::Instant;

/// Timing events of one submission: the upload's start and end (on the upload's stream),
/// the kernels' start (on the compute stream, after waiting for the upload), after the
/// fused kernel, after conv2d, the JPEG decode's start and end (on the upload's stream,
/// before the upload; only when the submission has JPEG frames), after the download. The
/// last one means done.
const EVENTS: usize = 8;
const UPLOAD_START: usize = 0;
const UPLOADED: usize = 1;
const KERNELS_START: usize = 2;
const PREPROCESSED: usize = 3;
const CONVOLVED: usize = 4;
const DECODE_START: usize = 5;
const DECODED: usize = 6;
const DONE: usize = EVENTS - 1;

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
    /// mapped in `mapped` mode): the one CPU copy of a frame. A frame in lent memory
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
            if let Source::Pixels(data, Some(lent)) = source {
                match self.registry.in_place(data, lent, SRC_SLACK) {
                    Ok(frame) => {
                        lent.count_read(Ok(()));
                        staging.in_place = Some(frame);
                        continue;
                    }
                    Err(why) => lent.count_read(Err(why)),
                }
            }
            let len = source.staged_len();
            let (slot, kind) = match source {
                Source::Pixels(..) => (&mut staging.host, self.pinned_kind(PinnedKind::Upload)),
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
fn parallel_copy(dst: &mut [u8], src: &[u8]) {
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
}

impl<'s> Source<'s> {
    /// `frame` as a source: pixels, or a JPEG for the device decoder. Any other compressed
    /// frame (PNG) is the caller's to decode on the host first.
    pub(crate) fn of<'a: 's>(frame: Frame<'a, 's>) -> Result<Source<'s>> {
        match frame {
            Frame::Pixels(v) => Ok(Source::Pixels(v.data(), v.lent())),
            Frame::Compressed(c) if c.codec() == Codec::Jpeg => Ok(Source::Jpeg(c)),
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
            Source::Jpeg(c) => {
                crate::compressed::jpeg_pieces(c.data()).iter().map(|p| p.len()).sum()
            }
        }
    }
}

/// Decode: the JPEG frames `jpegs` (slot index in `e.inputs`, frame) of entry `e`, whose
/// compressed bytes are staged, in ONE nvJPEG call into each slot's device buffer (tight
/// rows plus [`SRC_SLACK`]), on `up`, between the entry's decode events. Returns each
/// one's device address, in order.
///
/// # Safety
/// The entry is free (no GPU work of an earlier submission uses its buffers) and stays so
/// until this submission completes.
pub(crate) unsafe fn decode_jpegs(
    nv: &mut NvJpeg,
    e: &mut Entry,
    up: &Arc<CudaStream>,
    jpegs: &[(usize, &Compressed<'_>)],
) -> Result<Vec<CUdeviceptr>> {
    e.record(DECODE_START, up)?;
    let mut dsts = Vec::with_capacity(jpegs.len());
    for &(i, c) in jpegs {
        let len = c.step() as usize * c.height() as usize;
        let what = format!("the decoded JPEG of slot {i}");
        dsts.push(e.inputs[i].dev.ensure(up, len + SRC_SLACK, &what)?);
    }
    let items = jpegs
        .iter()
        .zip(&dsts)
        .map(|(&(i, c), &dst)| {
            Ok(DecodeItem {
                // SAFETY: staged bytes no GPU work writes; they stay untouched until the
                // submission completes (the precondition).
                jpeg: unsafe { e.inputs[i].staged(Source::Jpeg(c).staged_len()) }?,
                width: c.width(),
                height: c.height(),
                grey: c.encoding() == Encoding::Mono8,
                dst,
                pitch: c.step() as usize,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // SAFETY: each destination holds step * height (+ slack) bytes of this entry's device
    // memory and the JPEGs are this entry's pinned staging, both untouched until the
    // submission completes (the precondition); `up` is a stream of nvJPEG's context.
    unsafe { nv.decode_batch(up, &items) }?;
    e.record(DECODED, up)?;
    Ok(dsts)
}

/// One frame's buffers in a ring entry (or the batch's slot table): pinned host memory
/// the CPU stages into, and its copy on the device (`upload` mode; a decoded JPEG in
/// both modes).
#[derive(Default)]
pub(crate) struct Staging {
    host: Option<PinnedBuffer>,
    /// This submission's frame, read in place from lent memory (nothing staged).
    in_place: Option<InPlace>,
    /// A JPEG's compressed bytes (cached pinned memory: nvJPEG reads them on the host).
    compressed: Option<PinnedBuffer>,
    dev: DeviceBuffer,
}

impl Staging {
    /// The first `len` staged bytes of a JPEG.
    ///
    /// # Safety
    /// No GPU work writes the staging buffer while the slice is used.
    pub(crate) unsafe fn staged(&self, len: usize) -> Result<&[u8]> {
        match &self.compressed {
            // SAFETY: no GPU write is pending (the precondition).
            Some(h) if h.len() >= len => Ok(unsafe { &h.host()[..len] }),
            _ => Err(Error::misuse("decoding a JPEG", "it was not staged: stage it first")),
        }
    }

    /// Upload the first `len` staged bytes (or the frame read in place) on `up` and
    /// return the address the kernels read: the device copy (`len` + [`SRC_SLACK`]
    /// bytes), or in `mapped` mode the pinned buffer (the lent memory) itself. `what`
    /// names it in errors.
    ///
    /// # Safety
    /// No GPU work of an earlier submission may use the device copy (the ring entry is
    /// free), and the staged bytes stay alive and untouched until this submission
    /// completes.
    pub(crate) unsafe fn upload(
        &mut self,
        len: usize,
        up: &Arc<CudaStream>,
        what: &str,
    ) -> Result<CUdeviceptr> {
        if let Some(frame) = self.in_place {
            if let Some(d) = frame.device {
                return Ok(d);
            }
            let d = self.dev.ensure(up, len + SRC_SLACK, what)?;
            // SAFETY: the frame's `len` bytes lie in registered memory its source lent,
            // unchanged until this submission completes (the caller keeps the frame);
            // `d` as below.
            unsafe { sys::cuMemcpyHtoDAsync_v2(d, frame.host as *const _, len, up.cu_stream()) }
                .result()
                .map_err(|e| drv_err(format!("uploading {len} bytes of {what} in place"), e))?;
            return Ok(d);
        }
        let Some(host) = self.host.as_ref() else {
            return Err(Error::misuse(
                format!("uploading {what}"),
                "nothing was staged: stage it first",
            ));
        };
        if let Some(d) = host.device_ptr() {
            return Ok(d);
        }
        let d = self.dev.ensure(up, len + SRC_SLACK, what)?;
        // SAFETY: the pinned source holds `len` staged bytes and stays alive and
        // untouched until the submission completes; `d` has at least `len` bytes and no
        // earlier GPU work uses it (the precondition).
        unsafe { sys::cuMemcpyHtoDAsync_v2(d, host.host_ptr().cast(), len, up.cu_stream()) }
            .result()
            .map_err(|e| drv_err(format!("uploading {len} bytes of {what}"), e))?;
        Ok(d)
    }
}

/// One submission's sampling tables on the device (x then y: i0 | i1 | w1 bits, the
/// kernels' layout), uploaded on the compute stream (in order with the kernels that read
/// the old ones) only when they change: once per frame size.
#[derive(Default)]
pub(super) struct Tables {
    dev: DeviceBuffer,
    of: Option<(AxisMap, AxisMap)>,
}

impl Tables {
    /// The device address of `op`'s tables, and whether they were uploaded now. `op`
    /// has passed [`PreprocessOp::check`] for its frame: the kernels trust the tables.
    pub(super) fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        op: &PreprocessOp,
    ) -> Result<(CUdeviceptr, bool)> {
        if let (Some((x, y)), Some(d)) = (&self.of, self.dev.ptr(stream)) {
            if *x == op.x_map && *y == op.y_map {
                return Ok((d, false));
            }
        }
        let mut words: Vec<u8> = Vec::with_capacity(12 * (op.x_map.i0.len() + op.y_map.i0.len()));
        for m in [&op.x_map, &op.y_map] {
            words.extend(m.i0.iter().flat_map(|v| v.to_le_bytes()));
            words.extend(m.i1.iter().flat_map(|v| v.to_le_bytes()));
            words.extend(m.w1.iter().flat_map(|v| v.to_le_bytes()));
        }
        let d = self.dev.ensure(stream, words.len(), "sampling tables")?;
        // SAFETY: d has at least words.len() bytes; the source is pageable, so the call
        // returns only after the bytes have been staged and `words` may then be dropped.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(d, words.as_ptr().cast(), words.len(), stream.cu_stream())
        }
        .result()
        .map_err(|e| drv_err("uploading the sampling tables", e))?;
        self.of = Some((op.x_map.clone(), op.y_map.clone()));
        Ok((d, true))
    }

    /// The device address of the last tables, if any.
    pub(super) fn ptr(&self, stream: &CudaStream) -> Option<CUdeviceptr> {
        self.dev.ptr(stream)
    }
}

/// A ring entry: the buffers and timing events of one frame (the frame path: one input)
/// or one batch in flight.
pub(crate) struct Entry {
    /// Per frame (batch slot): its staging buffers.
    pub inputs: Vec<Staging>,
    /// The batch's slot table (unused by the frame path).
    pub table: Staging,
    /// The tensor(s) in host memory when they do not go to the caller's (see
    /// [`Gpu::destination`]).
    pub output: Option<PinnedBuffer>,
    /// See [`EVENTS`].
    events: [CudaEvent; EVENTS],
    pub in_flight: Option<InFlight>,
}

/// What is known of a submission in flight.
pub(crate) struct InFlight {
    /// Bytes of the tensor(s).
    pub len: usize,
    /// Host time of the stage step, microseconds.
    pub host_us: f32,
    /// The tensor(s) went straight to the caller's pinned memory, not to the entry's.
    pub direct: bool,
    /// The frame's encoding (its fused kernel), `None` for a batch: for the message of a
    /// failed submission.
    pub encoding: Option<Encoding>,
    /// JPEG frames were decoded on the device (the decode events were recorded).
    pub decoded: bool,
}

impl Entry {
    pub(crate) fn new(ctx: &Arc<CudaContext>, inputs: usize) -> Result<Self, CudaError> {
        let event = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| drv_err("cuEventCreate(timing)", e))
        };
        Ok(Entry {
            inputs: (0..inputs).map(|_| Staging::default()).collect(),
            table: Staging::default(),
            output: None,
            events: [
                event()?,
                event()?,
                event()?,
                event()?,
                event()?,
                event()?,
                event()?,
                event()?,
            ],
            in_flight: None,
        })
    }

    fn record(&self, event: usize, on: &CudaStream) -> Result<(), CudaError> {
        self.events[event].record(on).map_err(|e| drv_err("cuEventRecord", e))
    }

    /// Start the upload step on `up`.
    pub(crate) fn begin_upload(&self, up: &CudaStream) -> Result<(), CudaError> {
        self.record(UPLOAD_START, up)
    }

    /// End the upload step on `up`: the compute stream waits for it when it ran on the
    /// copy stream, then the kernels' step starts.
    pub(crate) fn end_upload(
        &self,
        up: &Arc<CudaStream>,
        compute: &Arc<CudaStream>,
    ) -> Result<(), CudaError> {
        self.record(UPLOADED, up)?;
        if !Arc::ptr_eq(up, compute) {
            compute
                .wait(&self.events[UPLOADED])
                .map_err(|e| drv_err("cuStreamWaitEvent(upload)", e))?;
        }
        self.record(KERNELS_START, compute)
    }

    /// Wait for the submission queued on this entry to complete.
    pub(crate) fn wait(&self, what: &str) -> Result<(), CudaError> {
        self.events[DONE].synchronize().map_err(|e| drv_err(what, e))
    }

    /// Finish: wait for the submission in flight, copy its tensor(s) into `out` (exactly
    /// their length) unless they went to the caller's memory directly or `out` is `None`
    /// (read in place), and return its stage times (the upload with the host staging, the
    /// download with the copy out) with what was in flight.
    pub(crate) fn finish(&mut self, out: Option<&mut [u8]>) -> Result<(StageTimes, InFlight)> {
        let Some(f) = self.in_flight.take() else {
            return Err(Error::misuse(
                "finish",
                "nothing in flight on this ring entry: submit first",
            ));
        };
        let (what, kernel) = match f.encoding {
            Some(enc) => ("frame", resize_normalize_entry(enc)),
            None => ("batch", RESIZE_NORMALIZE_BATCH.to_string()),
        };
        let out = out.filter(|_| !f.direct);
        if let Some(wrong) = out.as_ref().map(|o| o.len()).filter(|&n| n != f.len) {
            let len = f.len;
            self.in_flight = Some(f); // A caller's mistake: the submission stays queued.
            return Err(Error::Operation(format!(
                "the output buffer holds {wrong} bytes but the {what}'s tensors are {len}; pass \
                 a buffer of exactly their length"
            )));
        }
        // The host side of the download: the wait for the whole submission, the copy out.
        let _range = nvtx::stage(Stage::Download);
        self.wait(&format!("running the {what} (upload, {kernel}, conv, download)"))?;
        let ms = |a: usize, b: usize| {
            self.events[a].elapsed_ms(&self.events[b]).map_err(|e| drv_err("cuEventElapsedTime", e))
        };
        let up = ms(UPLOAD_START, UPLOADED)?;
        // From the decode's start event, recorded before nvJPEG's host work, to its end on
        // the device: the host part and the device part (the upload's stream is idle when
        // a submission starts).
        let decode = if f.decoded { ms(DECODE_START, DECODED)? } else { 0.0 };
        let (pre, conv, down) =
            (ms(KERNELS_START, PREPROCESSED)?, ms(PREPROCESSED, CONVOLVED)?, ms(CONVOLVED, DONE)?);
        let t = Instant::now();
        if let Some(out) = out {
            // SAFETY: the submission's last event has completed: nothing writes it.
            parallel_copy(out, &unsafe { self.output_bytes() }?[..f.len]);
        }
        let times = StageTimes {
            decode_us: decode * 1e3,
            upload_us: f.host_us + up * 1e3,
            preprocess_us: pre * 1e3,
            conv_us: conv * 1e3,
            download_us: down * 1e3 + t.elapsed().as_secs_f32() * 1e6,
        };
        Ok((times, f))
    }

    /// The bytes of the entry's output.
    ///
    /// # Safety
    /// No GPU work that writes the output may be pending.
    pub(crate) unsafe fn output_bytes(&self) -> Result<&[u8]> {
        let o = self
            .output
            .as_ref()
            .ok_or_else(|| Error::misuse("finish", "ring entry output missing"))?;
        // SAFETY: no GPU write is pending (the precondition).
        Ok(unsafe { o.host() })
    }
}

/// conv2d in a submission: the kernel, its parameters and launch, and its input.
pub(crate) struct ConvStep<'a> {
    f: &'a CudaFunction,
    name: String,
    params: Conv2dParams,
    cfg: LaunchConfig,
    src: CUdeviceptr,
}

impl CudaBackend {
    /// The conv2d step over `slots` tensors of `p` (bit i of `skip`: slot i padded, left
    /// alone), reading `src`. Its weights must be in constant memory
    /// ([`CudaBackend::ensure_conv_constants`]).
    pub(crate) fn conv_step(
        &self,
        p: &PreprocessParams,
        conv: &Conv2dOp,
        slots: u32,
        skip: u32,
        src: CUdeviceptr,
    ) -> ConvStep<'_> {
        let (mut params, f, name) = self.conv_launch(p, conv);
        params.skip = skip;
        let cfg = launch::conv_tiled_batch_cfg(p.dst_width, p.dst_height, slots);
        ConvStep { f, name, params, cfg, src }
    }

    /// Launch -> download on entry `e`: the fused kernel (`fused` launches it), conv2d
    /// when given, the download of `len` bytes to `dst`, with the events between them.
    pub(crate) fn launch_and_download(
        &self,
        e: &Entry,
        fused: impl FnOnce() -> Result<(), CudaError>,
        conv: Option<ConvStep<'_>>,
        dst: Destination,
        len: usize,
    ) -> Result<(), CudaError> {
        let stream = &self.gpu.stream;
        // Each launch inside its stage's range and no other: Nsight Compute's NVTX filter
        // (`--nvtx-include "preprocess/"`) then selects exactly that stage's kernels.
        nvtx::stage(Stage::Preprocess).scope(fused)?;
        e.record(PREPROCESSED, stream)?;
        if let Some(c) = conv {
            let _range = nvtx::stage(Stage::Conv);
            launch_kernel!(stream, c.f, c.name, c.cfg, &c.params, &c.src, &dst.tensor)?;
        }
        e.record(CONVOLVED, stream)?;
        let _range = nvtx::stage(Stage::Download);
        self.gpu.download(dst, len)?;
        e.record(DONE, stream)
    }
}
