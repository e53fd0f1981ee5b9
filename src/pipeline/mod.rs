//! The pipeline: turns a validated [`Config`] and each frame's size into the backend's
//! operations (cached per frame size), selects the backend, runs a frame and returns
//! the tensor with its geometry and stage timing.

pub mod batch_sync;
pub mod conv;
pub mod failure;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod geometry;
pub mod message;

use crate::backend::{
    self, Backend, Conv2dOp, HostBuffer, PreprocessOp, PreprocessParams, StageTimes, TensorDesc,
};
use crate::bag::msgs::Header;
use crate::config::{BackendChoice, ChannelOrder, Config};
use crate::error::{Error, Result};
use crate::image::ImageView;
use failure::Recovery;
pub use failure::{
    BackendOpener, FailureAction, GpuFailure, GPU_RETRY_ATTEMPTS, GPU_RETRY_BACKOFF,
    GPU_RETRY_RESET_FRAMES,
};
#[cfg(feature = "fault-injection")]
pub use fault::{FaultKind, FaultPlan, INJECT_FAULT_ENV};
pub use geometry::{Geometry, Rect};
pub use message::{
    batch_items_cdr, frame_timing, BatchItemFields, TensorBatchFields, TensorCdr, TensorFields,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Alignment of the tensor data inside the message buffer (the CUDA kernels' vector
/// stores need 16 bytes when they write it directly; 64 keeps it on a cache line).
pub const TENSOR_ALIGN: usize = 64;

/// Spare bytes allocated with the message buffer, so that small changes of the message
/// (a longer frame_id) do not reallocate it.
const MESSAGE_SLACK: usize = 4096;

/// The serialized `Tensor` of the last frame, in a buffer from the backend
/// ([`Backend::alloc_host`]: pinned memory for CUDA), reused from frame to frame.
#[derive(Default)]
struct MessageBuf {
    buf: Option<HostBuffer>,
    /// Offset of the message in `buf` (so that its data is [`TENSOR_ALIGN`]ed).
    start: usize,
    /// The message's layout around its data.
    cdr: TensorCdr,
}

impl MessageBuf {
    /// Make room for the message `cdr` describes (allocating from `backend` if needed)
    /// and write everything but the data; returns the data's bytes.
    fn prepare(&mut self, backend: &mut dyn Backend) -> Result<&mut [u8]> {
        let (need, prefix_len) = (self.cdr.len(), self.cdr.prefix.len());
        let offset = |buf: &HostBuffer| {
            let data_at = buf.as_slice().as_ptr() as usize + prefix_len;
            (TENSOR_ALIGN - data_at % TENSOR_ALIGN) % TENSOR_ALIGN
        };
        let fits = |buf: &HostBuffer| offset(buf) + need <= buf.len();
        if !self.buf.as_ref().is_some_and(fits) {
            self.buf = None;
            self.buf = Some(backend.alloc_host(need + TENSOR_ALIGN + MESSAGE_SLACK)?);
        }
        let Some(buf) = self.buf.as_mut() else {
            return Err(Error::Operation("message buffer missing after allocation".into()));
        };
        self.start = offset(buf);
        let message = &mut buf.as_mut_slice()[self.start..self.start + need];
        self.cdr.write_around(message);
        Ok(&mut message[self.cdr.data_range()])
    }

    /// Replace the suffix of the message in the buffer by `suffix`, of the same length
    /// (the `TensorBatch` items with the ages known at publish time).
    fn rewrite_suffix(&mut self, suffix: Vec<u8>) -> Result<()> {
        if suffix.len() != self.cdr.suffix.len() {
            return Err(Error::Operation(format!(
                "message suffix of {} bytes cannot replace one of {}",
                suffix.len(),
                self.cdr.suffix.len()
            )));
        }
        let at = self.start + self.cdr.prefix.len() + self.cdr.data_len;
        if let Some(buf) = self.buf.as_mut() {
            buf.as_mut_slice()[at..at + suffix.len()].copy_from_slice(&suffix);
        }
        self.cdr.suffix = suffix;
        Ok(())
    }

    fn message(&self) -> &[u8] {
        match &self.buf {
            Some(buf) => &buf.as_slice()[self.start..self.start + self.cdr.len()],
            None => &[],
        }
    }

    fn tensor(&self) -> &[u8] {
        let r = self.cdr.data_range();
        let m = self.message();
        m.get(r).unwrap_or(&[])
    }
}

/// Where the message buffers handed out by [`Pipeline::take_message`] come back to when
/// dropped; those of a backend replaced meanwhile are freed instead (pinned memory keeps
/// its CUDA context alive, and a faulted context must go before a new one can be made).
#[derive(Default)]
struct MessagePool {
    free: Mutex<Vec<MessageBuf>>,
    /// Bumped by every backend replacement.
    generation: AtomicU64,
    /// Messages handed out and not dropped yet.
    outstanding: AtomicUsize,
}

impl MessagePool {
    fn free(&self) -> MutexGuard<'_, Vec<MessageBuf>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a backend replacement waits for the messages still being published from
/// another thread to be dropped (normally one publish: milliseconds).
pub const OUTSTANDING_WAIT: Duration = Duration::from_secs(2);

/// A finished message taken out of the pipeline ([`Pipeline::take_message`]) to be
/// published on another thread while the pipeline fills its next buffer. Dropping it
/// gives the buffer back to the pipeline.
pub struct OwnedMessage {
    buf: Option<MessageBuf>,
    /// A batch's items (empty for a single frame), for [`OwnedMessage::set_batch_ages`].
    items: Vec<KeptItem>,
    generation: u64,
    pool: Arc<MessagePool>,
}

impl OwnedMessage {
    /// The serialized message.
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.message())
    }

    /// As [`Pipeline::set_batch_ages`], for this message.
    pub fn set_batch_ages(&mut self, ages: &[f32]) -> Result<()> {
        match self.buf.as_mut() {
            Some(buf) => write_batch_ages(buf, &self.items, ages),
            None => Err(Error::Operation("message already given back".into())),
        }
    }
}

impl Drop for OwnedMessage {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // Under the pool's lock, as the generation changes (replace_backend): a buffer
            // is either back before a replacement clears the pool or freed here.
            let mut free = self.pool.free();
            if self.pool.generation.load(Ordering::Acquire) == self.generation {
                free.push(buf);
            } else {
                drop(buf); // freed before `outstanding` says so
            }
        }
        self.pool.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The fields of `items` with their ages (0 for invalid items).
fn batch_fields<'a>(items: &'a [KeptItem], ages: &[f32]) -> Vec<BatchItemFields<'a>> {
    items
        .iter()
        .zip(ages)
        .map(|(k, &age_us)| BatchItemFields {
            topic: &k.topic,
            valid: k.valid,
            repeated: k.repeated,
            header: &k.header,
            source_encoding: &k.source_encoding,
            geometry: k.geometry.as_ref(),
            age_us: if k.valid { age_us } else { 0.0 },
        })
        .collect()
}

/// Write each item's `age_us` into the `TensorBatch` in `buf`.
fn write_batch_ages(buf: &mut MessageBuf, items: &[KeptItem], ages: &[f32]) -> Result<()> {
    let body_offset = buf.cdr.prefix.len() - 4 + buf.cdr.data_len;
    let suffix = batch_items_cdr(body_offset, &batch_fields(items, ages));
    buf.rewrite_suffix(suffix)
}

/// One processed frame: the tensor bytes (and the serialized `Tensor` message around
/// them) live in the [`Pipeline`]'s message buffer.
#[derive(Debug, Clone)]
pub struct FrameInfo {
    /// Shape and type of the tensor.
    pub desc: TensorDesc,
    /// The geometry used (scale, offset, source size).
    pub geometry: Geometry,
    /// Stage timing reported by the backend.
    pub times: StageTimes,
    /// The backend failed on this frame and `gpu_failure_policy` recovered: what was
    /// done (the tensor is the new backend's).
    pub gpu_failure: Option<GpuFailure>,
}

/// One slot of a batch for [`Pipeline::process_batch`].
#[derive(Debug, Clone, Copy)]
pub struct BatchInput<'a, 'b> {
    /// The input topic of the slot (resolved).
    pub topic: &'b str,
    /// The frame, or `None` (camera stale, frame invalid): the slot is padded.
    pub image: Option<&'b ImageView<'a>>,
    /// Header of the frame.
    pub header: &'b Header,
    /// Encoding as it arrived.
    pub source_encoding: &'b str,
    /// The frame was in an earlier batch.
    pub repeated: bool,
}

/// One processed batch: the `TensorBatch` message is in the [`Pipeline`]'s buffer.
#[derive(Debug, Clone)]
pub struct BatchInfo {
    /// Shape and type of ONE item's tensor.
    pub desc: TensorDesc,
    /// Per slot, the geometry used (`None`: padded).
    pub geometries: Vec<Option<Geometry>>,
    /// Slots whose frame was refused (its roi does not fit, ...): (slot, reason); they are
    /// padded and flagged invalid.
    pub rejected: Vec<(usize, String)>,
    /// Stage times of the whole batch.
    pub times: StageTimes,
    /// As [`FrameInfo::gpu_failure`].
    pub gpu_failure: Option<GpuFailure>,
}

/// The fields of a batch's items kept until the ages are known
/// ([`Pipeline::set_batch_ages`]).
#[derive(Debug, Clone, Default)]
struct KeptItem {
    topic: String,
    valid: bool,
    repeated: bool,
    header: Header,
    source_encoding: String,
    geometry: Option<Geometry>,
}

type CachedOp = ((u32, u32), Geometry, PreprocessOp);

/// Builds the operations for each frame size and runs them on a backend.
pub struct Pipeline {
    config: Config,
    backend: Box<dyn Backend>,
    /// Operation for the last frame size: (width, height) -> (geometry, op).
    cached: Option<CachedOp>,
    /// Batches: the operation of each slot's last frame size, and the one padded slots use.
    batch_cached: Vec<Option<CachedOp>>,
    pad_op: Option<PreprocessOp>,
    batch_items: Vec<KeptItem>,
    conv: Option<Conv2dOp>,
    message: MessageBuf,
    /// Buffers of messages taken out ([`Pipeline::take_message`]) and given back.
    pool: Arc<MessagePool>,
    recovery: Recovery,
}

impl Pipeline {
    /// A pipeline for a validated `config` on `backend`. With the feature
    /// `fault-injection`, reads `VISION_PREPROC_INJECT_CUDA_FAULT` (an invalid value is an
    /// error naming it).
    pub fn new(config: Config, backend: Box<dyn Backend>) -> Result<Self> {
        config.validate()?;
        let conv = conv_op(&config)?;
        let recovery = Recovery::new(&config);
        #[cfg(feature = "fault-injection")]
        let recovery =
            Recovery { injection: fault::Injection::new(FaultPlan::from_env()?), ..recovery };
        Ok(Pipeline {
            config,
            backend,
            cached: None,
            batch_cached: Vec::new(),
            pad_op: None,
            batch_items: Vec::new(),
            conv,
            message: MessageBuf::default(),
            pool: Arc::default(),
            recovery,
        })
    }

    /// Test hook (feature `fault-injection`): make the backend fail as `plan` says (what
    /// [`INJECT_FAULT_ENV`] does), counting frames from the next one as frame 1.
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&mut self, plan: FaultPlan) {
        self.recovery.injection = fault::Injection::new(Some(plan));
        self.recovery.frame = 0;
    }

    /// Replace how `retry` opens a new backend (default: the kind `backend` asks for,
    /// with `device_id` and `memory_mode`). For tests and harnesses.
    pub fn set_backend_opener(&mut self, opener: BackendOpener) {
        self.recovery.opener = opener;
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The backend in use.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Replace the configuration (validated first; on error the old one stays). Cheap
    /// changes apply to the next frame; size changes rebuild the cached operation.
    pub fn set_config(&mut self, config: Config) -> Result<()> {
        config.validate()?;
        self.conv = conv_op(&config)?;
        self.config = config;
        self.cached = None;
        self.batch_cached.clear();
        self.pad_op = None;
        Ok(())
    }

    /// Process one frame. The tensor's bytes are in [`Pipeline::tensor_bytes`] until the
    /// next call (and in [`Pipeline::message`], with an empty header).
    pub fn process(&mut self, image: &ImageView<'_>) -> Result<FrameInfo> {
        self.process_message(image, &Header::default(), image.encoding().name())
    }

    /// Process one frame into the serialized `vision_preproc_msgs/Tensor` of it, with
    /// `header` and `source_encoding` (the encoding as it arrived): until the next call,
    /// [`Pipeline::message`] holds the message, ready to publish or write to a bag, and
    /// [`Pipeline::tensor_bytes`] its data. The backend writes the tensor in place.
    pub fn process_message(
        &mut self,
        image: &ImageView<'_>,
        header: &Header,
        source_encoding: &str,
    ) -> Result<FrameInfo> {
        let key = (image.width(), image.height());
        let entry = match self.cached.take() {
            Some(cached) if cached.0 == key => cached,
            _ => {
                let geometry = Geometry::resolve(&self.config, key.0, key.1)?;
                let op = preprocess_op(&self.config, &geometry);
                (key, geometry, op)
            }
        };
        let (_, geometry, op) = self.cached.insert(entry);
        // Per-frame fields of the source (same size, maybe another encoding or step).
        op.params.set_source(image);
        let (desc, geometry) = (op.params.tensor_desc(), geometry.clone());
        let cdr = TensorCdr::new(&TensorFields {
            header,
            name: &self.config.tensor_name,
            desc,
            geometry: &geometry,
            source_encoding,
        });
        // The layout is kept in the message buffer; run_backend writes it around the
        // tensor (again after a backend was replaced).
        self.message.cdr = cdr;
        self.recovery.frame += 1;
        let (times, gpu_failure) = match self.run_backend(image) {
            Ok(times) => {
                self.recovery.good_frame();
                (times, None)
            }
            Err(e @ Error::Cuda(_)) if !self.recovery.fell_back => {
                let (times, failure) =
                    self.recover(e.to_string(), &mut |p| p.run_backend(image))?;
                (times, Some(failure))
            }
            Err(e) => return Err(e),
        };
        Ok(FrameInfo { desc, geometry, times, gpu_failure })
    }

    /// Process one batch into the serialized `vision_preproc_msgs/TensorBatch` of it:
    /// slot i from `items[i]`, each exactly as [`Pipeline::process_message`] computes a
    /// single frame, a slot without an image (or whose frame does not fit the
    /// configuration, e.g. the roi) padded and flagged invalid. `header` is the batch's.
    /// Until the next call [`Pipeline::message`] holds the message (with ages 0 until
    /// [`Pipeline::set_batch_ages`]) and [`Pipeline::tensor_bytes`] the N tensors.
    pub fn process_batch(
        &mut self,
        items: &[BatchInput<'_, '_>],
        header: &Header,
    ) -> Result<BatchInfo> {
        if self.batch_cached.len() != items.len() {
            self.batch_cached = (0..items.len()).map(|_| None).collect();
        }
        if self.pad_op.is_none() {
            self.pad_op = Some(pad_op(&self.config)?);
        }
        let mut geometries = Vec::with_capacity(items.len());
        let mut rejected = Vec::new();
        let mut images: Vec<Option<&ImageView<'_>>> = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            let Some(image) = it.image else {
                geometries.push(None);
                images.push(None);
                continue;
            };
            let key = (image.width(), image.height());
            let entry = match self.batch_cached[i].take() {
                Some(c) if c.0 == key => c,
                _ => match Geometry::resolve(&self.config, key.0, key.1) {
                    Ok(g) => {
                        let op = preprocess_op(&self.config, &g);
                        (key, g, op)
                    }
                    Err(e) => {
                        rejected.push((i, e.to_string()));
                        geometries.push(None);
                        images.push(None);
                        continue;
                    }
                },
            };
            let (_, g, op) = self.batch_cached[i].insert(entry);
            op.params.set_source(image);
            geometries.push(Some(g.clone()));
            images.push(Some(image));
        }
        let desc = self
            .pad_op
            .as_ref()
            .map(|p| p.params.tensor_desc())
            .ok_or_else(|| Error::Operation("no pad operation".into()))?;
        self.batch_items = items
            .iter()
            .zip(&geometries)
            .map(|(it, g)| {
                let valid = g.is_some();
                KeptItem {
                    topic: it.topic.to_string(),
                    valid,
                    repeated: valid && it.repeated,
                    header: if valid { it.header.clone() } else { Header::default() },
                    source_encoding: if valid {
                        it.source_encoding.to_string()
                    } else {
                        String::new()
                    },
                    geometry: g.clone(),
                }
            })
            .collect();
        let fields = batch_fields(&self.batch_items, &vec![0.0; items.len()]);
        self.message.cdr = TensorCdr::batch(&TensorBatchFields {
            header,
            name: &self.config.tensor_name,
            desc,
            items: &fields,
        });
        self.recovery.frame += 1;
        let (times, gpu_failure) = match self.run_batch(&images) {
            Ok(times) => {
                self.recovery.good_frame();
                (times, None)
            }
            Err(e @ Error::Cuda(_)) if !self.recovery.fell_back => {
                let (times, failure) =
                    self.recover(e.to_string(), &mut |p| p.run_batch(&images))?;
                (times, Some(failure))
            }
            Err(e) => return Err(e),
        };
        Ok(BatchInfo { desc, geometries, rejected, times, gpu_failure })
    }

    /// Write each item's `age_us` (publish time minus its stamp) into the last batch's
    /// message; `ages[i]` for slot i (ignored for invalid slots).
    pub fn set_batch_ages(&mut self, ages: &[f32]) -> Result<()> {
        write_batch_ages(&mut self.message, &self.batch_items, ages)
    }

    /// Take the last message out (with a batch's items, for
    /// [`OwnedMessage::set_batch_ages`]), to publish it on another thread; the next frame
    /// or batch goes into another buffer (one given back, or a new one). Dropping the
    /// message gives its buffer back. After this, [`Pipeline::message`] is not that
    /// message any more.
    pub fn take_message(&mut self) -> OwnedMessage {
        let next = self.pool.free().pop().unwrap_or_default();
        let buf = std::mem::replace(&mut self.message, next);
        self.pool.outstanding.fetch_add(1, Ordering::AcqRel);
        OwnedMessage {
            buf: Some(buf),
            items: std::mem::take(&mut self.batch_items),
            generation: self.pool.generation.load(Ordering::Acquire),
            pool: Arc::clone(&self.pool),
        }
    }

    /// Run the batch on the current backend (or fail as injected), into the message.
    fn run_batch(&mut self, images: &[Option<&ImageView<'_>>]) -> Result<StageTimes> {
        #[cfg(feature = "fault-injection")]
        if let Some(kind) =
            self.recovery.injection.due(self.recovery.frame, self.recovery.fell_back)
        {
            return Err(self.backend.inject_fault(kind));
        }
        let Some(pad) = self.pad_op.as_ref() else {
            return Err(Error::Operation("no pad operation".into()));
        };
        let mut slots = Vec::with_capacity(images.len());
        for (i, image) in images.iter().enumerate() {
            let op = match (image, self.batch_cached.get(i)) {
                (Some(_), Some(Some((_, _, op)))) => op,
                _ => pad,
            };
            slots.push(backend::BatchSlot { image: *image, op });
        }
        let out = self.message.prepare(self.backend.as_mut())?;
        self.backend.process_batch_into(&slots, self.conv.as_ref(), out)
    }

    /// Run the cached operation on the current backend (or fail as injected), the
    /// tensor landing inside the message buffer.
    fn run_backend(&mut self, image: &ImageView<'_>) -> Result<StageTimes> {
        #[cfg(feature = "fault-injection")]
        if let Some(kind) =
            self.recovery.injection.due(self.recovery.frame, self.recovery.fell_back)
        {
            return Err(self.backend.inject_fault(kind));
        }
        let Some((_, _, op)) = &self.cached else {
            return Err(Error::Operation("no operation for this frame size".into()));
        };
        let out = self.message.prepare(self.backend.as_mut())?;
        self.backend.process_into(image, op, self.conv.as_ref(), out)
    }

    /// Replace the backend. The message buffer goes first: it may be pinned memory that
    /// keeps the old backend's CUDA context alive. Returns how many messages taken out
    /// on the old backend's buffers were still not dropped after [`OUTSTANDING_WAIT`]
    /// (normally 0).
    fn replace_backend(&mut self, backend: Box<dyn Backend>) -> usize {
        self.message.buf = None;
        // Messages taken out on this backend's buffers: free those given back, and wait
        // (bounded) for the ones still being published, so that no buffer of the old
        // backend outlives it.
        {
            let mut free = self.pool.free();
            self.pool.generation.fetch_add(1, Ordering::AcqRel);
            free.clear();
        }
        let deadline = Instant::now() + OUTSTANDING_WAIT;
        while self.pool.outstanding.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.backend = backend;
        self.pool.outstanding.load(Ordering::Acquire)
    }

    /// `gpu_failure_policy` after the backend failed on `image` with `reason`: rebuild
    /// or replace the backend and run the frame again, or give up (`exit`).
    fn recover(
        &mut self,
        reason: String,
        run: &mut dyn FnMut(&mut Self) -> Result<StageTimes>,
    ) -> Result<(StageTimes, GpuFailure)> {
        use crate::config::GpuFailurePolicy as P;
        self.recovery.good_frames = 0;
        let mut unreturned = 0;
        let action = match self.recovery.policy {
            P::Exit => return Err(Error::GpuFailure { reason }),
            P::Fallback => FailureAction::FellBack,
            P::Retry => {
                let mut attempts = 0;
                let mut last_error = String::new();
                while self.recovery.attempts_used < GPU_RETRY_ATTEMPTS {
                    let backoff = GPU_RETRY_BACKOFF[self.recovery.attempts_used as usize];
                    self.recovery.attempts_used += 1;
                    attempts += 1;
                    std::thread::sleep(backoff);
                    // Drop the failed backend first: its context must be released before
                    // a new one can be made (a faulted CUDA context is reset when its last
                    // reference goes).
                    unreturned = self.replace_backend(Box::new(backend::cpu::CpuBackend::new()));
                    match (self.recovery.opener)(&self.config) {
                        Ok(b) => {
                            self.replace_backend(b);
                        }
                        Err(e) => {
                            last_error = format!("opening a new backend: {e}");
                            continue;
                        }
                    }
                    match run(self) {
                        Ok(times) => {
                            let failure = GpuFailure {
                                reason,
                                action: FailureAction::Rebuilt { attempt: attempts },
                                backend: self.backend.name(),
                                unreturned_messages: unreturned,
                            };
                            return Ok((times, failure));
                        }
                        Err(e @ Error::Cuda(_)) => last_error = format!("the frame again: {e}"),
                        Err(e) => return Err(e),
                    }
                }
                FailureAction::RetriesExhausted { attempts, last_error }
            }
        };
        unreturned =
            unreturned.max(self.replace_backend(Box::new(backend::cpu::CpuBackend::new())));
        self.recovery.fell_back = true;
        let times = run(self)?;
        let backend = self.backend.name();
        Ok((times, GpuFailure { reason, action, backend, unreturned_messages: unreturned }))
    }

    /// The bytes of the last tensor (little-endian, dense in its layout).
    pub fn tensor_bytes(&self) -> &[u8] {
        self.message.tensor()
    }

    /// The serialized `vision_preproc_msgs/Tensor` of the last frame (CDR, what the
    /// typed publisher would send), see [`Pipeline::process_message`].
    pub fn message(&self) -> &[u8] {
        self.message.message()
    }

    /// The last tensor de-normalized to an 8-bit image (see [`preview`]).
    pub fn preview_image(&self) -> Result<PreviewImage> {
        match &self.cached {
            Some((_, _, op)) if self.tensor_bytes().len() == op.params.tensor_desc().byte_len() => {
                Ok(preview(&op.params, self.tensor_bytes()))
            }
            _ => Err(Error::Operation("no frame has been processed yet".into())),
        }
    }
}

/// An 8-bit image of what the network sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewImage {
    /// Network image width.
    pub width: u32,
    /// Network image height.
    pub height: u32,
    /// 3 (RGB, whatever the tensor's channel order) or 1 (grey).
    pub channels: u32,
    /// Rows of `width * channels` bytes.
    pub data: Vec<u8>,
}

/// De-normalize a tensor written by `params` back to 8-bit source units, the inverse of
/// `value = pixel * scale[c] + bias[c]`: `pixel = (value - bias[c]) / scale[c]`, rounded
/// and clamped to 0..=255, channels back in RGB order. Letterbox padding shows as
/// `pad_value`.
pub fn preview(params: &PreprocessParams, tensor: &[u8]) -> PreviewImage {
    let desc = params.tensor_desc();
    let (w, h, ch) = (desc.width as usize, desc.height as usize, desc.channels as usize);
    let mut data = vec![0u8; w * h * ch];
    for y in 0..h {
        for x in 0..w {
            for c in 0..ch {
                let v = backend::read_element(desc.dtype, tensor, desc.index(c, y, x));
                let pixel = (v - params.bias[c]) / params.scale[c];
                let rgb = if ch == 3 && params.swap_rb != 0 { 2 - c } else { c };
                data[(y * w + x) * ch + rgb] = pixel.round().clamp(0.0, 255.0) as u8;
            }
        }
    }
    PreviewImage { width: desc.width, height: desc.height, channels: desc.channels, data }
}

/// Resolve the fused operation for one geometry.
pub fn preprocess_op(cfg: &Config, g: &Geometry) -> PreprocessOp {
    let channels = cfg.output_channels;
    let mut scale = [0.0f32; 3];
    let mut bias = [0.0f32; 3];
    let mut pad = [0.0f32; 3];
    let swap_rb = channels == 3 && cfg.channel_order == ChannelOrder::Bgr;
    for c in 0..channels as usize {
        let mean = Config::per_channel(&cfg.image_mean, c);
        let std = Config::per_channel(&cfg.image_stddev, c);
        scale[c] = (cfg.pixel_scale / std) as f32;
        bias[c] = (-mean / std) as f32;
        // pad_value is [R, G, B] in source units; output channel c is R, G or B.
        let pad_src = if channels == 1 {
            // Grey padding: the weights of the colour conversion (OpenCV 5's RGB2GRAY),
            // without integer rounding so [v, v, v] pads with exactly v.
            let p = |i: usize| Config::per_channel(&cfg.pad_value, i);
            crate::backend::cpu::decode::pad_grey([p(0), p(1), p(2)])
        } else {
            let rgb_index = if swap_rb { 2 - c } else { c };
            Config::per_channel(&cfg.pad_value, rgb_index)
        };
        pad[c] = ((pad_src * cfg.pixel_scale - mean) / std) as f32;
    }
    let params = PreprocessParams {
        src_width: g.source_width,
        src_height: g.source_height,
        src_step: 0,
        encoding: 0,
        big_endian: 0,
        dst_width: g.network_width,
        dst_height: g.network_height,
        content_x: g.content.x,
        content_y: g.content.y,
        content_w: g.content.w,
        content_h: g.content.h,
        channels,
        swap_rb: u32::from(swap_rb),
        layout: cfg.output_layout,
        dtype: cfg.output_dtype,
        interpolation: cfg.interpolation,
        scale,
        bias,
        pad,
    };
    PreprocessOp { params, x_map: g.x_map(cfg.interpolation), y_map: g.y_map(cfg.interpolation) }
}

/// The operation a padded batch slot is given: the configuration's tensor and pad value
/// (its source size is any that the configuration accepts).
fn pad_op(cfg: &Config) -> Result<PreprocessOp> {
    let (w, h) = if cfg.roi.len() == 4 {
        let c = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
        (c(cfg.roi[0] + cfg.roi[2]), c(cfg.roi[1] + cfg.roi[3]))
    } else {
        (cfg.network_image_width, cfg.network_image_height)
    };
    let g = Geometry::resolve(cfg, w, h)?;
    Ok(preprocess_op(cfg, &g))
}

/// The conv2d operation of a configuration, or `None` for `conv.kernel: none`.
pub fn conv_op(cfg: &Config) -> Result<Option<Conv2dOp>> {
    conv::conv_op(cfg)
}

/// Pick the backend for `cfg.backend`. Returns the backend and, when `auto` fell back
/// to the CPU, the reason (for a warning and a diagnostics note).
pub fn select_backend(cfg: &Config) -> Result<(Box<dyn Backend>, Option<String>)> {
    match cfg.backend {
        BackendChoice::Cpu => Ok((Box::new(backend::cpu::CpuBackend::new()), None)),
        BackendChoice::Cuda => {
            Ok((backend::cuda::CudaBackend::open(cfg.device_id, cfg.memory_mode)?, None))
        }
        BackendChoice::Auto => {
            match backend::cuda::CudaBackend::open(cfg.device_id, cfg.memory_mode) {
                Ok(b) => Ok((b, None)),
                Err(e) => Ok((Box::new(backend::cpu::CpuBackend::new()), Some(e.to_string()))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    fn pipeline() -> Pipeline {
        let cfg = Config {
            network_image_width: 16,
            network_image_height: 8,
            inputs: vec!["a/image".into(), "b/image".into()],
            ..Config::default()
        };
        Pipeline::new(cfg, Box::new(CpuBackend::new())).expect("pipeline")
    }

    /// One batch of two 8x4 rgb8 frames whose pixels are all `v`.
    fn batch(p: &mut Pipeline, v: u8, stamp: i32) -> Result<BatchInfo> {
        let data = vec![v; 8 * 4 * 3];
        let image = ImageView::new(8, 4, 24, "rgb8", false, &data).expect("image");
        let header = Header { sec: stamp, nanosec: 0, frame_id: "cam".into() };
        let inputs: Vec<BatchInput<'_, '_>> = ["a/image", "b/image"]
            .iter()
            .map(|topic| BatchInput {
                topic,
                image: Some(&image),
                header: &header,
                source_encoding: "rgb8",
                repeated: false,
            })
            .collect();
        p.process_batch(&inputs, &header)
    }

    #[test]
    fn a_taken_message_stays_while_the_next_batch_is_written_and_its_buffer_comes_back() {
        let mut p = pipeline();
        batch(&mut p, 10, 1).expect("batch 1");
        let first = p.message().to_vec();
        let mut taken = p.take_message();
        assert_eq!(taken.bytes(), &first[..]);
        batch(&mut p, 200, 2).expect("batch 2");
        let second = p.message().to_vec();
        assert_ne!(second, first, "the second batch went into another buffer");
        assert_eq!(taken.bytes(), &first[..], "the taken message is untouched");
        // Ages are written into the taken message as Pipeline::set_batch_ages would.
        taken.set_batch_ages(&[5.0, 7.0]).expect("ages");
        let mut reference = pipeline();
        batch(&mut reference, 10, 1).expect("reference");
        reference.set_batch_ages(&[5.0, 7.0]).expect("ages");
        assert_eq!(taken.bytes(), reference.message());
        assert_eq!(p.pool.outstanding.load(Ordering::Acquire), 1);
        drop(taken);
        assert_eq!(p.pool.outstanding.load(Ordering::Acquire), 0);
        assert_eq!(p.pool.free().len(), 1, "the buffer came back for the next take");
        let _second_taken = p.take_message();
        assert!(p.pool.free().is_empty(), "...and was reused");
    }

    #[test]
    fn a_replaced_backend_frees_the_buffers_of_its_messages() {
        let mut p = pipeline();
        batch(&mut p, 10, 1).expect("batch");
        let taken = p.take_message();
        let publisher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50)); // publishing
            drop(taken);
        });
        // The replacement waits for the message being published, then frees its buffer
        // instead of taking it back.
        let left = p.replace_backend(Box::new(CpuBackend::new()));
        assert_eq!(left, 0);
        assert!(p.pool.free().is_empty(), "no buffer of the old backend kept");
        publisher.join().expect("publisher");
        batch(&mut p, 10, 2).expect("a batch on the new backend");
    }
}
