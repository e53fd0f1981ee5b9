//! Backends compute one function, defined by the CPU backend (the specification) and
//! reproduced by the CUDA backend. They know nothing of ROS or of the configuration
//! file: the pipeline resolves everything into the plain operation structs of `ops`.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;
pub(crate) mod ops;

pub use crate::compressed::Compressed;
#[cfg(feature = "fault-injection")]
use crate::error::CudaError;
use crate::error::{Error, Result};
use crate::image::{DeviceView, Encoding, ImageView};
pub(crate) use ops::{read_element, write_element};
pub use ops::{read_elements, AxisMap, Conv2dOp, PreprocessOp, PreprocessParams, TensorDesc};

/// Time spent in each stage of one frame, in microseconds. A stage a backend does not
/// have is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    /// Decoding compressed frames (JPEG, PNG) into pixels: on the host (the CPU decoder)
    /// or on the device (nvJPEG); 0 for raw frames.
    pub decode_us: f32,
    /// Copy of the frame into the backend's input buffer.
    pub upload_us: f32,
    /// The fused decode + resize + pad + normalize + layout pass.
    pub preprocess_us: f32,
    /// conv2d.
    pub conv_us: f32,
    /// Copy of the tensor back to host memory.
    pub download_us: f32,
}

/// Where a submission's tensors go ([`Backend::submit_to`]).
#[derive(Debug, Clone, Copy)]
pub enum Out {
    /// `len` bytes of host memory at `ptr`.
    Host { ptr: *mut u8, len: usize },
    /// `len` bytes of device memory at `ptr` (a block of [`Backend::shared_blocks`]),
    /// and also the `len` bytes of host memory at `host` when given (the `tensor`
    /// message of a set that both outputs want). `ready`: the block's interprocess event
    /// ([`crate::handoff::BlockEvent::raw`]), recorded after the submission's last
    /// write.
    Device { ptr: u64, len: usize, host: Option<*mut u8>, ready: Option<usize> },
}

impl Out {
    /// Bytes of the tensors.
    pub fn len(&self) -> usize {
        match *self {
            Out::Host { len, .. } | Out::Device { len, .. } => len,
        }
    }

    /// No bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A compute backend.
pub trait Backend: Send {
    /// "cpu" or "cuda", as published in `FrameTiming.backend`.
    fn name(&self) -> &'static str;

    /// A human-readable description of the device (CPU threads, GPU name and clock).
    fn device_description(&self) -> String;

    /// Extra facts for `/diagnostics` as (key, value), e.g. the GPU clock and memory
    /// mode. None by default.
    fn diagnostics(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The CUDA context frames in device memory must belong to for this backend to read
    /// them in place ([`Frame::Device`]): a GPU backend's own; `None` for a backend that
    /// reads host memory (by default).
    fn device_context(&self) -> Option<crate::image::DeviceContext> {
        None
    }

    /// Run the preprocessing (and conv2d, when given) on `image`, writing the finished
    /// tensor's bytes (`op.params.tensor_desc()`, little-endian) into `out`, which must
    /// be exactly `op.params.tensor_desc().byte_len()` bytes (an error otherwise).
    ///
    /// `out` may lie anywhere, e.g. inside the serialized message that will be
    /// published. The CUDA backend copies the tensor straight into `out` when `out` is
    /// pinned memory of its own context ([`Backend::alloc_host`]: in `mapped` mode the
    /// kernel writes it there), else through its own pinned buffer and one CPU copy.
    /// Nothing writes `out` after the call returns, error or not.
    fn process_into(&mut self, work: FrameWork<'_, '_>, out: &mut [u8]) -> Result<StageTimes>;

    /// A batch: slot i of `out` (`out.len() / slots.len()` bytes each, every slot's
    /// `op.params.tensor_desc()` the same) gets what [`Backend::process_into`] writes for
    /// `slots[i]`, or, for a slot without an image, the normalized pad value
    /// (`op.params.pad`) everywhere (no conv2d: a padded slot is constant). The stage
    /// times are the batch's. This default runs the slots one after the other; the CPU
    /// backend runs them in parallel, the CUDA backend in one launch.
    fn process_batch_into(&mut self, w: BatchWork<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
        let BatchWork { slots, conv } = w;
        let item_len = check_batch(slots, out)?;
        let mut total = StageTimes::default();
        for (slot, chunk) in slots.iter().zip(out.chunks_mut(item_len)) {
            match slot.image {
                Some(image) => {
                    let t = self.process_into(FrameWork::new(image, slot.op, conv), chunk)?;
                    total.decode_us += t.decode_us;
                    total.upload_us += t.upload_us;
                    total.preprocess_us += t.preprocess_us;
                    total.conv_us += t.conv_us;
                    total.download_us += t.download_us;
                }
                None => fill_pad(&slot.op.params, chunk),
            }
        }
        Ok(total)
    }

    /// How many submissions ([`Backend::submit_into`]) may be in flight at once: 1 for a
    /// backend that computes a submission before `submit_into` returns (the default),
    /// 2 for the CUDA backend (frame k+1 staged and uploaded while frame k computes).
    fn max_in_flight(&self) -> usize {
        1
    }

    /// Get ready to decode sets of up to `frames` compressed frames (a node's compressed
    /// inputs) before the first one comes, so that it is not slower than the next; by
    /// default there is nothing to get ready (the CPU decoder has no state).
    fn prepare_decoding(&mut self, frames: usize) -> Result<()> {
        let _ = frames;
        Ok(())
    }

    /// The pipelined form of [`Backend::process_into`] / [`Backend::process_batch_into`]:
    /// check `job` and queue its work, its tensor(s) going to `out`
    /// ([`Out::Device`]: device memory of [`Backend::shared_blocks`], refused by a backend
    /// without device memory). The job's frames are not read after the call returns
    /// (they are staged), except a frame whose view is lent
    /// ([`crate::image::ImageView::lent`]), which a GPU backend may read in place until its
    /// submission is finished (or abandoned); `out` is written until the matching [`Backend::finish_oldest`]
    /// returns. A job that fails its checks (an operation that does not fit its frame, a
    /// wrong length) is refused with an operation error before anything is queued. The
    /// default computes the job before returning ([`Queued::Done`]); a backend with
    /// [`Backend::max_in_flight`] above 1 returns [`Queued::Pending`] and the stage times
    /// come from `finish_oldest`.
    ///
    /// # Safety
    /// `out`'s memory must be valid for writes of its length, and neither read nor
    /// written by anyone else, until this submission's `finish_oldest` returned (Ok or
    /// Err) or [`Backend::abandon_all`] returned; the job's lent frames stay alive and
    /// unchanged as long (`pipeline::InFlight` keeps a set's frames until it is finished).
    unsafe fn submit_to(&mut self, job: Job<'_, '_>, out: Out) -> Result<Queued> {
        let Out::Host { ptr, len } = out else {
            return Err(Error::misuse(
                "submit_to",
                format!("the {} backend has no device memory to write into", self.name()),
            ));
        };
        // SAFETY: the caller's promise (above); the work completes before this returns.
        let out = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        let times = match job {
            Job::Frame(work) => self.process_into(work, out)?,
            Job::Batch(work) => self.process_batch_into(work, out)?,
        };
        Ok(Queued::Done(times))
    }

    /// [`Backend::submit_to`] the `len` bytes of host memory at `out`.
    ///
    /// # Safety
    /// As [`Backend::submit_to`].
    unsafe fn submit_into(&mut self, job: Job<'_, '_>, out: *mut u8, len: usize) -> Result<Queued> {
        // SAFETY: the caller's promise is submit_to's.
        unsafe { self.submit_to(job, Out::Host { ptr: out, len }) }
    }

    /// `count` blocks of at least `bytes` of device memory that other processes can
    /// import (the zero-copy hand-off, docs/HANDOFF.md), for [`Out::Device`]. `Ok(None)`:
    /// this backend has no device memory (the CPU backend); an error says why a device
    /// cannot (no virtual memory management or no POSIX file descriptor handles: the
    /// node then uses host blocks). The blocks keep the backend's device context alive:
    /// release them before the backend is replaced (`Pool::release_device`).
    fn shared_blocks(
        &self,
        _count: usize,
        _bytes: usize,
    ) -> Result<Option<Box<dyn crate::handoff::DeviceBlocks>>> {
        Ok(None)
    }

    /// Wait for the oldest [`Queued::Pending`] submission and return its stage times (its
    /// tensors are then in its `out`). After an error every queued submission is
    /// abandoned (as [`Backend::abandon_all`]). The default has none in flight.
    fn finish_oldest(&mut self) -> Result<StageTimes> {
        Err(Error::misuse("finish_oldest", format!("nothing in flight on {}", self.name())))
    }

    /// Wait for everything queued (errors are ignored: they are the failure being
    /// handled) and forget it: no submission's `out` is written after this returns.
    fn abandon_all(&mut self) {}

    /// [`Backend::process_into`] a `Vec`, resized to fit.
    fn process(&mut self, work: FrameWork<'_, '_>, out: &mut Vec<u8>) -> Result<StageTimes> {
        out.resize(work.op.params.tensor_desc().byte_len(), 0);
        self.process_into(work, out)
    }

    /// Host memory of at least `len` bytes (zeroed) for [`Backend::process_into`] to
    /// write into at full speed: page-locked memory of the device's context for the
    /// CUDA backend (device-mapped in `mapped` mode), the heap for the CPU backend. A
    /// buffer of a CUDA backend keeps that backend's context alive: drop it before
    /// the backend when replacing one (a faulted context is reset only when its last
    /// user goes).
    fn alloc_host(&mut self, len: usize) -> Result<HostBuffer> {
        Ok(HostBuffer::heap(len))
    }

    /// Test hook (feature `fault-injection`): make the next submission fault on the
    /// device after its kernels ([`FaultKind::InFlight`]); false where the backend cannot
    /// (no device: the default).
    #[cfg(feature = "fault-injection")]
    fn arm_in_flight_fault(&mut self) -> bool {
        false
    }

    /// Test hook (feature `fault-injection`; `VISION_PREPROC_INJECT_CUDA_FAULT`, see
    /// `pipeline::FaultPlan`): make the device fail the way a real fault of `kind` does
    /// and return the error the failed frame gets. The CUDA backend causes a real fault;
    /// a backend without a device returns a simulated CUDA error, so the failure policy
    /// can be exercised without a GPU.
    #[cfg(feature = "fault-injection")]
    fn inject_fault(&mut self, kind: FaultKind) -> Error {
        Error::Cuda(CudaError::driver(
            format!("injected {kind:?} fault (VISION_PREPROC_INJECT_CUDA_FAULT, test only)"),
            format!("simulated on the {} backend, which has no device", self.name()),
        ))
    }
}

/// Bytes in host memory that a backend may have special access to (see
/// [`Backend::alloc_host`]).
pub trait HostMemory: Send {
    /// The bytes.
    fn bytes(&self) -> &[u8];
    /// The bytes, to write.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl HostMemory for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// A host buffer from [`Backend::alloc_host`]: heap or page-locked memory.
pub struct HostBuffer(Box<dyn HostMemory>);

impl HostBuffer {
    /// `len` zeroed bytes on the heap.
    pub fn heap(len: usize) -> Self {
        HostBuffer(Box::new(vec![0u8; len]))
    }

    /// Wrap memory a backend allocated.
    pub fn new(memory: Box<dyn HostMemory>) -> Self {
        HostBuffer(memory)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.bytes().len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.0.bytes()
    }

    /// The bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.0.bytes_mut()
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer({} bytes)", self.len())
    }
}

/// What [`Backend::submit_into`] runs: one frame (the single-frame entry, a kernel per
/// encoding on CUDA) or a batch (one launch for every slot).
#[derive(Debug, Clone, Copy)]
pub enum Job<'a, 'b> {
    /// [`Backend::process_into`]'s work.
    Frame(FrameWork<'a, 'b>),
    /// [`Backend::process_batch_into`]'s work.
    Batch(BatchWork<'a, 'b>),
}

/// What [`Backend::submit_into`] did with a job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Queued {
    /// Computed before `submit_into` returned: these are its stage times.
    Done(StageTimes),
    /// In flight: [`Backend::finish_oldest`] returns its stage times, in submission order.
    Pending,
}

/// The key of a backend's [`Backend::diagnostics`] that says where compressed frames
/// are decoded (`/diagnostics`, `vision_preproc info`).
pub(crate) const DECODER_KEY: &str = "Compressed frames decoded";
/// The CPU decoders ([`Compressed::decode`]).
pub const HOST_DECODERS: &str = "zune-jpeg for JPEG, png for PNG";

/// A frame as a backend receives it: its pixels, or a compressed frame (JPEG, PNG) whose
/// headers were checked ([`Compressed::probe`]) and which the backend decodes where its
/// kernels run (the CPU backend on the host; the CUDA backend on the device where it has
/// a decoder for it, else on the host: `with_host_pixels_except`).
#[derive(Debug, Clone, Copy)]
pub enum Frame<'a, 'b> {
    /// Pixel rows.
    Pixels(&'b ImageView<'a>),
    /// A compressed frame, not decoded yet.
    Compressed(&'b Compressed<'a>),
    /// Pixel rows in device memory (a hardware decoder's CUDA memory): the CUDA backend's
    /// kernels read them in place; a backend that reads host memory refuses them.
    Device(&'b DeviceView<'a>),
}

impl<'a, 'b> From<&'b DeviceView<'a>> for Frame<'a, 'b> {
    fn from(d: &'b DeviceView<'a>) -> Self {
        Frame::Device(d)
    }
}

impl<'a, 'b> From<&'b ImageView<'a>> for Frame<'a, 'b> {
    fn from(image: &'b ImageView<'a>) -> Self {
        Frame::Pixels(image)
    }
}

impl<'a, 'b> From<&'b Compressed<'a>> for Frame<'a, 'b> {
    fn from(c: &'b Compressed<'a>) -> Self {
        Frame::Compressed(c)
    }
}

impl<'a, 'b> Frame<'a, 'b> {
    /// The pixel rows, `None` for a compressed frame.
    pub fn pixels(&self) -> Option<&'b ImageView<'a>> {
        match *self {
            Frame::Pixels(v) => Some(v),
            Frame::Compressed(_) | Frame::Device(_) => None,
        }
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        match self {
            Frame::Pixels(v) => v.width(),
            Frame::Compressed(c) => c.width(),
            Frame::Device(d) => d.width(),
        }
    }

    /// Height in pixels.
    pub fn height(&self) -> u32 {
        match self {
            Frame::Pixels(v) => v.height(),
            Frame::Compressed(c) => c.height(),
            Frame::Device(d) => d.height(),
        }
    }

    /// The pixels' encoding (a compressed frame's: what its decode gives).
    pub fn encoding(&self) -> Encoding {
        match self {
            Frame::Pixels(v) => v.encoding(),
            Frame::Compressed(c) => c.encoding(),
            Frame::Device(d) => d.encoding(),
        }
    }

    /// Bytes per row of the pixels (a compressed frame's: tight rows).
    pub fn step(&self) -> u32 {
        match self {
            Frame::Pixels(v) => v.step(),
            Frame::Compressed(c) => c.step(),
            Frame::Device(d) => d.step(),
        }
    }

    /// Big-endian 16-bit samples (never for a decoded frame).
    pub fn big_endian(&self) -> bool {
        match self {
            Frame::Pixels(v) => v.big_endian(),
            Frame::Compressed(_) | Frame::Device(_) => false,
        }
    }
}

/// A frame's pixels on the host: borrowed, or decoded on the CPU.
pub(crate) enum HostPixels<'a, 'b> {
    /// The frame's own pixels.
    Borrowed(&'b ImageView<'a>),
    /// A compressed frame, decoded.
    Decoded(crate::compressed::Decoded),
}

impl HostPixels<'_, '_> {
    /// `frame`'s pixels, decoding a compressed one on the CPU.
    pub(crate) fn of<'a, 'b>(frame: Frame<'a, 'b>) -> Result<HostPixels<'a, 'b>> {
        Ok(match frame {
            Frame::Pixels(v) => HostPixels::Borrowed(v),
            Frame::Compressed(c) => HostPixels::Decoded(c.decode()?),
            Frame::Device(_) => return Err(device_frame_refused()),
        })
    }

    /// The pixels.
    pub(crate) fn view(&self) -> ImageView<'_> {
        match self {
            HostPixels::Borrowed(v) => **v,
            HostPixels::Decoded(d) => d.view(),
        }
    }
}

/// A frame in device memory given to a backend that reads host memory: the caller's
/// error (an operation error, never a device failure).
pub(crate) fn device_frame_refused() -> Error {
    Error::Operation(
        "a frame in device memory (CUDA memory from a hardware decoder) reached a backend \
         that reads host memory: run the node with the CUDA backend, or end the pipeline \
         in system memory (`... ! cudadownload` or caps without `memory:CUDAMemory`)"
            .into(),
    )
}

/// The frames of `job`: the frame, or each slot's (`None`: a padded slot).
pub(crate) fn job_frames<'a, 'b>(job: &Job<'a, 'b>) -> Vec<Option<Frame<'a, 'b>>> {
    match job {
        Job::Frame(w) => vec![Some(w.image)],
        Job::Batch(w) => w.slots.iter().map(|s| s.image).collect(),
    }
}

/// Run `f` on `job` with its compressed frames decoded on the host first (the CPU
/// decoder), and how long the decoding took (us): for a backend that has no decoder of
/// its own for a frame. The compressed frames whose entry in `keep` (by the index of
/// [`job_frames`]) is `true` stay compressed: the backend decodes those itself. A decode
/// error is the job's.
pub(crate) fn with_host_pixels_except<R>(
    job: Job<'_, '_>,
    keep: &[bool],
    f: impl FnOnce(Job<'_, '_>) -> Result<R>,
) -> Result<(R, f32)> {
    let frames = job_frames(&job);
    let kept = |i: usize| keep.get(i).copied().unwrap_or(false);
    if !frames.iter().enumerate().any(|(i, f)| matches!(f, Some(Frame::Compressed(_))) && !kept(i))
    {
        return Ok((f(job)?, 0.0));
    }
    let start = std::time::Instant::now();
    let pixels = frames
        .iter()
        .enumerate()
        .map(|(i, f)| match f {
            // Kept compressed; a frame in device memory is never brought to the host.
            Some(Frame::Compressed(_)) if kept(i) => Ok(None),
            Some(Frame::Device(_)) => Ok(None),
            Some(f) => HostPixels::of(*f).map(Some),
            None => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    let views: Vec<Option<ImageView<'_>>> =
        pixels.iter().map(|p| p.as_ref().map(HostPixels::view)).collect();
    let decode_us = start.elapsed().as_secs_f32() * 1e6;
    // Each frame: its host pixels, or itself (kept compressed; a padded slot stays None).
    let frame = |i: usize| match (&views[i], frames[i]) {
        (Some(v), _) => Some(Frame::Pixels(v)),
        (None, kept) => kept,
    };
    let r = match job {
        Job::Frame(w) => {
            let Some(image) = frame(0) else {
                return Err(Error::misuse("submit_to", "a frame job without its frame"));
            };
            f(Job::Frame(FrameWork::new(image, w.op, w.conv)))?
        }
        Job::Batch(w) => {
            let slots: Vec<BatchSlot<'_, '_>> = w
                .slots
                .iter()
                .enumerate()
                .map(|(i, s)| BatchSlot { image: frame(i), op: s.op })
                .collect();
            f(Job::Batch(BatchWork::new(&slots, w.conv)))?
        }
    };
    Ok((r, decode_us))
}

/// One frame's work ([`Backend::process_into`]): the frame, the operation for its size and
/// the conv2d after it (`None`: none).
#[derive(Debug, Clone, Copy)]
pub struct FrameWork<'a, 'b> {
    /// The frame.
    pub image: Frame<'a, 'b>,
    /// Its operation.
    pub op: &'b PreprocessOp,
    /// The conv2d after it.
    pub conv: Option<&'b Conv2dOp>,
}

impl<'a, 'b> FrameWork<'a, 'b> {
    /// `image` (pixels or a compressed frame) through `op`, then `conv`.
    pub fn new(
        image: impl Into<Frame<'a, 'b>>,
        op: &'b PreprocessOp,
        conv: Option<&'b Conv2dOp>,
    ) -> Self {
        FrameWork { image: image.into(), op, conv }
    }
}

/// A batch's work ([`Backend::process_batch_into`]): its slots and the conv2d after each
/// (`None`: none).
#[derive(Debug, Clone, Copy)]
pub struct BatchWork<'a, 'b> {
    /// One per camera.
    pub slots: &'b [BatchSlot<'a, 'b>],
    /// The conv2d after each slot's preprocessing.
    pub conv: Option<&'b Conv2dOp>,
}

impl<'a, 'b> BatchWork<'a, 'b> {
    /// `slots`, each then through `conv`.
    pub fn new(slots: &'b [BatchSlot<'a, 'b>], conv: Option<&'b Conv2dOp>) -> Self {
        BatchWork { slots, conv }
    }
}

/// One slot of a batch ([`Backend::process_batch_into`]): a frame and its operation, or
/// no frame (the slot is padded; `op` gives the tensor's shape and pad value).
#[derive(Debug, Clone, Copy)]
pub struct BatchSlot<'a, 'b> {
    /// The frame, `None` for a padded slot.
    pub image: Option<Frame<'a, 'b>>,
    /// The operation for this frame's size (for a padded slot: any of the batch's).
    pub op: &'b PreprocessOp,
}

impl<'a, 'b> BatchSlot<'a, 'b> {
    /// A slot of `image` (pixels or a compressed frame) through `op`.
    pub fn frame(image: impl Into<Frame<'a, 'b>>, op: &'b PreprocessOp) -> Self {
        BatchSlot { image: Some(image.into()), op }
    }

    /// A padded slot of `op`'s tensor.
    pub fn padded(op: &'b PreprocessOp) -> Self {
        BatchSlot { image: None, op }
    }
}

/// Check a batch: at least one slot, the same tensor in every slot, `out` exactly
/// `slots.len()` tensors. Returns the bytes of one slot.
pub(crate) fn check_batch(slots: &[BatchSlot<'_, '_>], out: &[u8]) -> Result<usize> {
    check_batch_len(slots, out.len())
}

/// [`check_batch`] for an output of `len` bytes.
pub(crate) fn check_batch_len(slots: &[BatchSlot<'_, '_>], len: usize) -> Result<usize> {
    let item_len = check_batch_shape(slots)?;
    if len != item_len * slots.len() {
        return Err(Error::Operation(format!(
            "the batch output buffer holds {len} bytes but {} tensors of {item_len} bytes need {}; \
             pass a buffer of slots * op.params.tensor_desc().byte_len() bytes",
            slots.len(),
            item_len * slots.len()
        )));
    }
    Ok(item_len)
}

/// Check a batch's slots: at least one, the same tensor in every slot, each frame's
/// operation built for it ([`PreprocessOp::check`], the error naming the slot). Returns
/// the bytes of one slot.
pub(crate) fn check_batch_shape(slots: &[BatchSlot<'_, '_>]) -> Result<usize> {
    let Some(first) = slots.first() else {
        return Err(Error::misuse("process_batch", "a batch needs at least one slot"));
    };
    let desc = first.op.params.tensor_desc();
    for (i, slot) in slots.iter().enumerate() {
        if slot.op.params.tensor_desc() != desc {
            return Err(Error::Operation(format!(
                "batch slot {i} has tensor {:?}, slot 0 {desc:?}; build every slot's \
                 operation from one configuration",
                slot.op.params.tensor_desc()
            )));
        }
        if let Some(why) = slot.image.and_then(|image| slot.op.mismatch(image)) {
            return Err(Error::Operation(format!("batch slot {i}: {why}")));
        }
    }
    Ok(desc.byte_len())
}

/// Fill a tensor of `params` with its normalized pad value (`pad[c]` in channel c): what
/// a padded batch slot holds, on every backend.
pub(crate) fn fill_pad(params: &PreprocessParams, out: &mut [u8]) {
    let desc = params.tensor_desc();
    let ch = desc.channels as usize;
    let size = desc.dtype.size();
    let mut pixel = vec![0u8; ch * size];
    for c in 0..ch {
        write_element(desc.dtype, &mut pixel, c, params.pad[c]);
    }
    match desc.layout {
        crate::config::Layout::Nhwc => {
            for px in out.chunks_exact_mut(ch * size) {
                px.copy_from_slice(&pixel);
            }
        }
        crate::config::Layout::Nchw => {
            let plane = desc.width as usize * desc.height as usize * size;
            for (c, p) in out.chunks_exact_mut(plane).enumerate() {
                for e in p.chunks_exact_mut(size) {
                    e.copy_from_slice(&pixel[c * size..(c + 1) * size]);
                }
            }
        }
    }
}

/// The error of a tensor destination of the wrong size.
pub(crate) fn check_out_len(op: &PreprocessOp, len: usize) -> Result<()> {
    let want = op.params.tensor_desc().byte_len();
    if len == want {
        return Ok(());
    }
    Err(Error::Operation(format!(
        "the output buffer holds {len} bytes but the tensor is {want}; pass a buffer of \
         op.params.tensor_desc().byte_len() bytes"
    )))
}

/// Test hook (feature `fault-injection`): which real device failure
/// [`Backend::inject_fault`] causes.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A kernel's illegal memory access: a sticky error, after which every call on the
    /// context fails (CUDA: "the process must be terminated and relaunched").
    Sticky,
    /// An allocation the device cannot satisfy (out of memory, as when another process
    /// took the memory): the call fails, the context stays usable.
    Transient,
    /// A sticky fault inside the set's own GPU work, after its kernels and before its
    /// shared block's event ([`Backend::arm_in_flight_fault`]): the submission succeeds
    /// (its `TensorRef` may go out), its finish fails. Where a backend cannot queue one,
    /// the set fails at its launch as with `Sticky`.
    InFlight,
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use crate::config::{Config, DType, Layout};
    use crate::pipeline::{preprocess_op, Geometry};

    /// A backend with only the required methods: [`Backend::process_batch_into`]'s
    /// default (slot after slot), what the CUDA backend runs.
    struct Sequential(cpu::CpuBackend);
    impl Backend for Sequential {
        fn name(&self) -> &'static str {
            "sequential"
        }
        fn device_description(&self) -> String {
            String::new()
        }
        fn process_into(&mut self, work: FrameWork<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
            self.0.process_into(work, out)
        }
    }

    fn pixels(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8).collect()
    }

    #[test]
    fn a_batch_is_its_slots_each_as_one_frame_and_padded_slots() {
        for (layout, dtype) in [(Layout::Nchw, DType::Float32), (Layout::Nhwc, DType::Float16)] {
            let cfg = Config {
                network_image_width: 13,
                network_image_height: 7,
                pad_value: vec![114.0, 20.0, 3.0],
                output_layout: layout,
                output_dtype: dtype,
                ..Config::default()
            };
            let conv = crate::pipeline::conv_op(&Config {
                conv: crate::config::ConvConfig {
                    kernel: crate::config::ConvKernel::Gaussian,
                    ..Default::default()
                },
                ..cfg.clone()
            })
            .unwrap();
            // Two cameras of other sizes and encodings, and a padded slot between them.
            let a = pixels(21 * 9 * 3, 1);
            let b = pixels(16 * 10 * 2, 2);
            let va = ImageView::new(21, 9, 63, "bgr8", false, &a).unwrap();
            let vb = ImageView::new(16, 10, 32, "yuyv", false, &b).unwrap();
            let op_for = |v: &ImageView<'_>| {
                let g = Geometry::resolve(&cfg, v.width(), v.height()).unwrap();
                let mut op = preprocess_op(&cfg, &g);
                op.params.src_step = v.step();
                op.params.encoding = v.encoding() as u32;
                op
            };
            let (oa, ob) = (op_for(&va), op_for(&vb));
            let slots = [
                BatchSlot::frame(&va, &oa),
                BatchSlot { image: None, op: &oa },
                BatchSlot::frame(&vb, &ob),
            ];
            let len = oa.params.tensor_desc().byte_len();
            for conv in [None, conv.as_ref()] {
                let mut want = vec![0u8; 3 * len];
                let mut cpu = cpu::CpuBackend::new();
                cpu.process_into(FrameWork::new(&va, &oa, conv), &mut want[..len]).unwrap();
                fill_pad(&oa.params, &mut want[len..2 * len]);
                cpu.process_into(FrameWork::new(&vb, &ob, conv), &mut want[2 * len..]).unwrap();
                let mut parallel = vec![0xEEu8; 3 * len];
                cpu::CpuBackend::new()
                    .process_batch_into(BatchWork::new(&slots, conv), &mut parallel)
                    .unwrap();
                assert!(parallel == want, "{layout:?} {dtype:?} conv {}: parallel", conv.is_some());
                let mut seq = vec![0xEEu8; 3 * len];
                Sequential(cpu::CpuBackend::new())
                    .process_batch_into(BatchWork::new(&slots, conv), &mut seq)
                    .unwrap();
                assert!(seq == want, "{layout:?} {dtype:?} conv {}: sequential", conv.is_some());
            }
            // The padded slot holds pad[c] in channel c, in the layout.
            let desc = oa.params.tensor_desc();
            let mut pad = vec![0u8; len];
            fill_pad(&oa.params, &mut pad);
            for (c, y, x) in [(0, 0, 0), (1, 3, 5), (2, 6, 12)] {
                assert_eq!(read_element(dtype, &pad, desc.index(c, y, x)), {
                    let v = oa.params.pad[c];
                    if dtype == DType::Float16 {
                        half::f16::from_f32(v).to_f32()
                    } else {
                        v
                    }
                });
            }
            // Wrong sizes are errors naming the fix.
            let e = cpu::CpuBackend::new()
                .process_batch_into(BatchWork::new(&slots, None), &mut pad)
                .unwrap_err();
            assert!(e.to_string().contains("slots * op.params.tensor_desc().byte_len()"), "{e}");
        }
    }
}
