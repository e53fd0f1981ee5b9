//! The pipeline: turns a validated [`Config`] and each frame's size into the backend's
//! operations (cached per input slot and frame size), selects the backend, and runs the
//! frames of one input set — one frame for a single camera, one per camera for a batch —
//! into the serialized output message (`Tensor` with one input, `TensorBatch` with 2+),
//! with each frame's geometry and the stage timing. One path for 1 and N inputs: a single
//! camera is a batch of one; only the backend entry point differs (one frame keeps its
//! per-encoding kernel, a batch is one launch).

pub mod conv;
#[cfg(any(test, feature = "fault-injection"))]
pub mod deferred;
pub mod encode;
pub mod failure;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod geometry;
pub mod message;

use crate::backend::{
    self, Backend, Conv2dOp, Job, PreprocessOp, PreprocessParams, Queued, StageTimes, TensorDesc,
};
use crate::config::{BackendChoice, ChannelOrder, Config};
use crate::error::{Error, Result};
use crate::handoff::{BlockMemory, Lease, Pool};
use crate::image::ImageView;
use crate::wire::msgs::Header;
pub use encode::{
    batch_items_cdr, frame_timing, BatchItemFields, TensorBatchFields, TensorCdr, TensorFields,
};
use failure::Recovery;
pub use failure::{
    BackendOpener, FailureAction, GpuFailure, GPU_RETRY_ATTEMPTS, GPU_RETRY_BACKOFF,
    GPU_RETRY_RESET_FRAMES,
};
#[cfg(feature = "fault-injection")]
pub use fault::{FaultKind, FaultPlan, INJECT_FAULT_ENV};
pub use geometry::{Geometry, Rect};
use message::{batch_fields, KeptItem, MessageBuf, MessagePool};
pub use message::{OwnedMessage, OUTSTANDING_WAIT, TENSOR_ALIGN};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// One input of a frame set for [`Pipeline::process_frames`]: a camera's frame (or none).
#[derive(Debug, Clone, Copy)]
pub struct FrameInput<'a, 'b> {
    /// The input topic (resolved; written into a `TensorBatch`'s item).
    pub topic: &'b str,
    /// The frame, or `None` (camera stale, frame invalid): a batch slot is padded.
    pub image: Option<&'b ImageView<'a>>,
    /// Header of the frame.
    pub header: &'b Header,
    /// Encoding as it arrived (`yuv422_yuy2`, not its alias).
    pub source_encoding: &'b str,
    /// The frame was in an earlier batch.
    pub repeated: bool,
}

impl<'a, 'b> FrameInput<'a, 'b> {
    /// A single camera's frame.
    pub fn frame(image: &'b ImageView<'a>, header: &'b Header, source_encoding: &'b str) -> Self {
        FrameInput { topic: "", image: Some(image), header, source_encoding, repeated: false }
    }
}

/// The header of a frame set: a single camera's own header; for a batch, the stamp of
/// its newest item with a frame (no frame_id: the items keep theirs).
pub fn set_header(items: &[FrameInput<'_, '_>]) -> Header {
    if let [only] = items {
        return only.header.clone();
    }
    items
        .iter()
        .filter(|i| i.image.is_some())
        .map(|i| i.header)
        .max_by_key(|h| (h.sec, h.nanosec))
        .map(|h| Header { sec: h.sec, nanosec: h.nanosec, frame_id: String::new() })
        .unwrap_or_default()
}

/// Why input `slot`'s frame was refused, as counted and logged: with 2+ inputs after its
/// topic (`/cam1/image: ...`), with one input the reason alone.
pub fn slot_reason(topics: &[String], slot: usize, why: &str) -> String {
    match topics.get(slot) {
        Some(topic) if topics.len() >= 2 => format!("{topic}: {why}"),
        _ => why.to_string(),
    }
}

/// One processed frame set: the message is in the [`Pipeline`]'s buffer
/// ([`Pipeline::message`], [`Pipeline::take_message`]).
#[derive(Debug, Clone)]
pub struct Processed {
    /// Shape and type of ONE input's tensor.
    pub desc: TensorDesc,
    /// Per input, the geometry used (`None`: a padded batch slot).
    pub geometries: Vec<Option<Geometry>>,
    /// Batch slots whose frame was refused (its roi does not fit, ...): (slot, reason);
    /// they are padded and flagged invalid. (A single camera's refused frame is an error.)
    pub rejected: Rejected,
    /// Stage times of the whole set.
    pub times: StageTimes,
    /// The backend failed on this set and `gpu_failure_policy` recovered: what was done
    /// (the tensors are the new backend's).
    pub gpu_failure: Option<GpuFailure>,
}

/// One processed frame ([`Pipeline::process`]).
#[derive(Debug, Clone)]
pub struct FrameInfo {
    /// Shape and type of the tensor.
    pub desc: TensorDesc,
    /// The geometry used (scale, offset, source size).
    pub geometry: Geometry,
    /// Stage timing reported by the backend.
    pub times: StageTimes,
    /// As [`Processed::gpu_failure`].
    pub gpu_failure: Option<GpuFailure>,
}

type CachedOp = ((u32, u32), Geometry, PreprocessOp);

/// Batch slots refused: (slot, reason).
pub type Rejected = Vec<(usize, String)>;

/// A frame set submitted ([`Pipeline::submit_frames`]) and not finished yet.
struct Pending {
    /// Its number (the NVTX ranges' `frame N`).
    set: u64,
    message: MessageBuf,
    desc: TensorDesc,
    geometries: Vec<Option<Geometry>>,
    rejected: Rejected,
    state: PendingState,
}

enum PendingState {
    /// Computed when submitted (a backend with one submission in flight): its times.
    Done(StageTimes),
    /// In flight on the backend: [`Backend::finish_oldest`] gives its times.
    InFlight,
    /// The backend failed when it was submitted: the failure policy acts at its finish.
    Failed(Error),
    /// Another submission's device error discarded it (or its backend was replaced): it
    /// is run again at its finish.
    Abandoned,
}

/// Builds the operations for each input's frame size and runs them on a backend.
pub struct Pipeline {
    config: Config,
    backend: Box<dyn Backend>,
    /// Per input slot, the operation of its last frame size: (width, height) -> (geometry, op).
    cached: Vec<Option<CachedOp>>,
    /// The operation padded batch slots use (the configuration's tensor and pad value).
    pad_op: Option<PreprocessOp>,
    conv: Option<Conv2dOp>,
    message: MessageBuf,
    /// Buffers of messages taken out ([`Pipeline::take_message`]) and given back.
    pool: Arc<MessagePool>,
    recovery: Recovery,
    /// Sets submitted and not finished, oldest first (at most the backend's
    /// [`Backend::max_in_flight`]).
    pending: VecDeque<Pending>,
    /// Pools of the backend's device memory ([`Pipeline::shared_pool`]), released when it
    /// is replaced.
    device_pools: Mutex<Vec<Weak<Pool>>>,
    /// Backends replaced so far.
    epoch: u64,
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
            cached: Vec::new(),
            pad_op: None,
            conv,
            message: MessageBuf::default(),
            pool: Arc::default(),
            recovery,
            pending: VecDeque::new(),
            device_pools: Mutex::default(),
            epoch: 0,
        })
    }

    /// A pool of `count` shared output blocks of at least `bytes` for this pipeline's
    /// backend, its socket in `dir` (docs/HANDOFF.md): device memory where the backend can
    /// share it, else host memory, with the reason when the backend has a device whose
    /// memory it could not share. A device pool is released when the backend is replaced
    /// (see [`Pipeline::backend_epoch`]).
    pub fn shared_pool(
        &self,
        count: usize,
        bytes: usize,
        lease: Duration,
        dir: &Path,
    ) -> Result<(Arc<Pool>, Option<String>)> {
        let why = match self.backend.shared_blocks(count, bytes) {
            Ok(Some(blocks)) => {
                let pool = Pool::device(blocks, lease, dir)?;
                let mut pools = self.device_pools.lock().unwrap_or_else(|p| p.into_inner());
                pools.retain(|w| w.strong_count() > 0);
                pools.push(Arc::downgrade(&pool));
                return Ok((pool, None));
            }
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        };
        Ok((Pool::host(count, bytes, lease, dir)?, why))
    }

    /// How many times the backend was replaced (`gpu_failure_policy`): a pool of
    /// [`Pipeline::shared_pool`] made at another epoch is stale (a device pool is
    /// released; a new backend may offer device memory).
    pub fn backend_epoch(&self) -> u64 {
        self.epoch
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
    /// changes apply to the next frame; size changes rebuild the cached operations.
    pub fn set_config(&mut self, config: Config) -> Result<()> {
        config.validate()?;
        self.conv = conv_op(&config)?;
        self.config = config;
        self.cached.clear();
        self.pad_op = None;
        Ok(())
    }

    /// Process one frame (a single camera, no header). The tensor's bytes are in
    /// [`Pipeline::tensor_bytes`] until the next call (and in [`Pipeline::message`]).
    pub fn process(&mut self, image: &ImageView<'_>) -> Result<FrameInfo> {
        let header = Header::default();
        let p = self.process_frames(
            &[FrameInput::frame(image, &header, image.encoding().name())],
            &header,
        )?;
        let geometry = p.geometries.into_iter().flatten().next().ok_or_else(|| {
            Error::Operation("process: the frame was padded instead of processed".into())
        })?;
        Ok(FrameInfo { desc: p.desc, geometry, times: p.times, gpu_failure: p.gpu_failure })
    }

    /// Process the frames of one input set into the serialized output message: with one
    /// input (`inputs` has fewer than 2 topics) a `vision_preproc_msgs/Tensor` of
    /// `items[0]` (which must have a frame; a frame the configuration refuses is an
    /// error), with 2+ a `TensorBatch` whose slot i is `items[i]`, each exactly what one
    /// input would give, a slot without a frame (or whose frame the configuration
    /// refuses, e.g. the roi) padded and flagged invalid. `header` is a batch's (the
    /// single frame's own header is `items[0].header`). Until the next call
    /// [`Pipeline::message`] holds the message (a batch's ages 0 until
    /// [`OwnedMessage::set_ages`]) and [`Pipeline::tensor_bytes`] its tensors.
    /// [`Pipeline::submit_frames`] then [`Pipeline::finish_frames`], with nothing else in
    /// flight.
    pub fn process_frames(
        &mut self,
        items: &[FrameInput<'_, '_>],
        header: &Header,
    ) -> Result<Processed> {
        if !self.pending.is_empty() {
            return Err(Error::Operation(format!(
                "process_frames with {} set(s) submitted and not finished: finish_frames first",
                self.pending.len()
            )));
        }
        self.submit_frames(items, header)?;
        self.finish_frames(items)
    }

    /// How many sets may be submitted and not finished at once: the backend's
    /// [`Backend::max_in_flight`] (2 on CUDA: set k+1 is staged and uploaded while set k
    /// computes; 1 on the CPU, which computes a set when it is submitted).
    pub fn max_in_flight(&self) -> usize {
        self.backend.max_in_flight().max(1)
    }

    /// Sets submitted and not finished.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The first half of [`Pipeline::process_frames`]: resolve the set's operations,
    /// write its message around the tensors and queue the backend's work (the frames are
    /// staged: they may go when this returns, but keep them for
    /// [`Pipeline::finish_frames`], which runs the set again if the backend fails).
    /// Errors: the set is refused (a single camera's frame that the configuration
    /// refuses, an operation error, more than [`Pipeline::max_in_flight`] sets); nothing
    /// was queued. A device error is not returned here: the set's finish handles it
    /// (`gpu_failure_policy`).
    pub fn submit_frames(&mut self, items: &[FrameInput<'_, '_>], header: &Header) -> Result<()> {
        self.submit_frames_to(items, header, None, true)
    }

    /// [`Pipeline::submit_frames`] with the tensors written into a shared `block`
    /// (`tensor_ref`, docs/HANDOFF.md) instead of the message: copied into the message
    /// too at the finish when `fill` (`tensor` has subscribers). The block travels with
    /// the message ([`OwnedMessage::tensor_ref`], [`OwnedMessage::take_block`]).
    pub fn submit_frames_to(
        &mut self,
        items: &[FrameInput<'_, '_>],
        header: &Header,
        block: Option<Lease>,
        fill: bool,
    ) -> Result<()> {
        let batch = self.config.is_batch();
        if items.is_empty() || (!batch && items.len() != 1) {
            return Err(Error::Operation(format!(
                "{} frames for a pipeline of {} input(s)",
                items.len(),
                self.config.input_topics().len()
            )));
        }
        if self.pending.len() >= self.max_in_flight() {
            return Err(Error::Operation(format!(
                "{} set(s) already submitted: finish_frames first",
                self.pending.len()
            )));
        }
        let (geometries, rejected) = self.resolve(items, batch)?;
        let params = self.view_params()?;
        let desc = params.tensor_desc();
        let mut message = self.pool.spare();
        message.cdr = if batch {
            message.items = kept_items(items, &geometries);
            TensorCdr::batch(&TensorBatchFields {
                header,
                name: &self.config.tensor_name,
                desc,
                items: &batch_fields(&message.items, &[]),
            })
        } else {
            message.items.clear();
            let (item, geometry) = (&items[0], geometries[0].as_ref());
            let geometry = geometry.ok_or_else(|| Error::Operation("no geometry".into()))?;
            TensorCdr::new(&TensorFields {
                header: item.header,
                name: &self.config.tensor_name,
                desc,
                geometry,
                source_encoding: item.source_encoding,
            })
        };
        message.params = Some(params);
        if block.is_some() {
            message.block_header = header.clone();
            message.name.clone_from(&self.config.tensor_name);
            message.block_items = if batch { Vec::new() } else { kept_items(items, &geometries) };
        }
        message.block = block;
        message.fill = fill;
        let images = images_of(items, &geometries);
        self.recovery.frame += 1;
        let state = match self.launch(&images, &mut message) {
            Ok(Queued::Done(times)) => PendingState::Done(times),
            Ok(Queued::Pending) => PendingState::InFlight,
            Err(e) if e.is_device_failure() => {
                // Nothing in flight survives a device error (an injected fault never
                // reached the backend: it is told too).
                self.backend.abandon_all();
                self.abandon_pending();
                PendingState::Failed(e)
            }
            Err(e) => {
                self.pool.give_back(message);
                return Err(e);
            }
        };
        let set = self.recovery.frame;
        self.pending.push_back(Pending { set, message, desc, geometries, rejected, state });
        Ok(())
    }

    /// Announce the set submitted last: when its tensors go to a shared block with an
    /// interprocess event (CUDA), its `TensorRef` (with `ages` per item and the event's
    /// handle) can go out now, before its GPU work ends; `publish` sends it and says
    /// whether it went out. Then the finished message does not describe it again
    /// ([`OwnedMessage::tensor_ref`] is `None`, [`OwnedMessage::announced`] true), and if
    /// the set fails its block is withdrawn (docs/HANDOFF.md). False when nothing was
    /// announced (no such block, the set failed already, or `publish` said no).
    pub fn announce(&mut self, ages: &[f32], publish: impl FnOnce(&[u8]) -> bool) -> bool {
        let Some(p) = self.pending.back_mut() else { return false };
        let announced = p.message.block.as_ref().is_some_and(Lease::announced);
        if announced || !matches!(p.state, PendingState::InFlight) {
            return false;
        }
        let Some(event) = p.message.block.as_mut().and_then(Lease::memory).and_then(|m| match m {
            BlockMemory::Device(_, _, event) => event,
            BlockMemory::Host(_) => None,
        }) else {
            return false;
        };
        let Some(cdr) = p.message.tensor_ref(ages, &event.handle) else { return false };
        if !publish(&cdr) {
            return false;
        }
        if let Some(block) = p.message.block.as_mut() {
            block.announce();
        }
        true
    }

    /// The second half of [`Pipeline::process_frames`]: wait for the oldest submitted set
    /// (`items` must be its frames, as submitted) and make its message the pipeline's
    /// ([`Pipeline::message`], [`Pipeline::take_message`]). A device error starts
    /// `gpu_failure_policy` on this set (run again on the rebuilt or fallback backend);
    /// the sets submitted after it are run again at their own finish.
    pub fn finish_frames(&mut self, items: &[FrameInput<'_, '_>]) -> Result<Processed> {
        let Some(mut p) = self.pending.pop_front() else {
            return Err(Error::Operation("finish_frames: no set submitted".into()));
        };
        let result = match std::mem::replace(&mut p.state, PendingState::Abandoned) {
            PendingState::Done(times) => Ok(times),
            PendingState::InFlight => {
                let (set, items, batch) = (p.set, items.len(), self.config.is_batch());
                let _range = crate::nvtx::push_with(|| crate::nvtx::frame_name(set, items, batch));
                let r = self.backend.finish_oldest();
                if r.as_ref().is_err_and(Error::is_device_failure) {
                    self.abandon_pending();
                }
                r
            }
            PendingState::Failed(e) => Err(e),
            PendingState::Abandoned => self.run_again(items, &mut p.message),
        };
        let (times, gpu_failure) = match result {
            Ok(times) => {
                self.recovery.good_frame();
                (times, None)
            }
            Err(e) if e.is_device_failure() && !self.recovery.fell_back => {
                // The failed backend's buffer goes before the backend does.
                p.message.release();
                let message = &mut p.message;
                let (times, failure) = self.recover(e.to_string(), &mut |pl| {
                    // A buffer of a backend replaced by an earlier attempt goes too.
                    message.release();
                    pl.run_again(items, message)
                })?;
                (times, Some(failure))
            }
            Err(e) => {
                self.pool.give_back(p.message);
                return Err(e);
            }
        };
        p.message.fill_from_block();
        let finished = std::mem::replace(&mut self.message, p.message);
        self.pool.give_back(finished);
        let Pending { desc, geometries, rejected, .. } = p;
        Ok(Processed { desc, geometries, rejected, times, gpu_failure })
    }

    /// Every set in flight is abandoned (the backend waited for and forgot them after a
    /// device error): each runs again at its finish.
    fn abandon_pending(&mut self) {
        for p in &mut self.pending {
            if matches!(p.state, PendingState::InFlight) {
                p.state = PendingState::Abandoned;
            }
        }
    }

    /// Run a set again, now, on the current backend (after a failure): its operations
    /// resolved again for `items` (the cache may hold a later set's sizes) and the
    /// tensors written into `message` (allocated from the current backend).
    fn run_again(
        &mut self,
        items: &[FrameInput<'_, '_>],
        message: &mut MessageBuf,
    ) -> Result<StageTimes> {
        let (geometries, _) = self.resolve(items, self.config.is_batch())?;
        let images = images_of(items, &geometries);
        match self.launch(&images, message)? {
            Queued::Done(times) => Ok(times),
            Queued::Pending => self.backend.finish_oldest(),
        }
    }

    /// Each input's operation (cached per slot and frame size) and geometry. A batch slot
    /// without a frame, or whose frame the configuration refuses, gets none (it is
    /// padded; the refusal is returned as (slot, reason)); for a single input the refusal
    /// is the error.
    fn resolve(
        &mut self,
        items: &[FrameInput<'_, '_>],
        batch: bool,
    ) -> Result<(Vec<Option<Geometry>>, Rejected)> {
        if self.cached.len() != items.len() {
            self.cached = (0..items.len()).map(|_| None).collect();
        }
        let mut geometries = Vec::with_capacity(items.len());
        let mut rejected = Vec::new();
        for (i, it) in items.iter().enumerate() {
            let Some(image) = it.image else {
                if !batch {
                    return Err(Error::Operation("no frame to process".into()));
                }
                geometries.push(None);
                continue;
            };
            let key = (image.width(), image.height());
            let entry = match self.cached[i].take() {
                Some(c) if c.0 == key => c,
                _ => match Geometry::resolve(&self.config, key.0, key.1) {
                    Ok(g) => {
                        let op = preprocess_op(&self.config, &g);
                        (key, g, op)
                    }
                    Err(e) if batch => {
                        rejected.push((i, e.to_string()));
                        geometries.push(None);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            let (_, g, op) = self.cached[i].insert(entry);
            // Per-frame fields of the source (same size, maybe another encoding or step).
            op.params.set_source(image);
            geometries.push(Some(g.clone()));
        }
        Ok((geometries, rejected))
    }

    /// Bytes of one set's tensors (a batch: all its items), as configured now
    /// ([`Config::tensor_bytes`]).
    pub fn output_bytes(&self) -> usize {
        self.config.tensor_bytes()
    }

    /// The parameters of the tensors written (size, layout, dtype, normalization): the
    /// pad operation's, which every slot shares; made on first use.
    fn view_params(&mut self) -> Result<PreprocessParams> {
        if self.pad_op.is_none() {
            self.pad_op = Some(pad_op(&self.config)?);
        }
        self.pad_op
            .as_ref()
            .map(|p| p.params)
            .ok_or_else(|| Error::Operation("no pad operation".into()))
    }

    /// Take the last message out, to publish it on another thread; the next frame set
    /// goes into another buffer (one given back, or a new one). Dropping the message
    /// gives its buffer back. After this, [`Pipeline::message`] is not that message any
    /// more.
    pub fn take_message(&mut self) -> OwnedMessage {
        self.pool.take(&mut self.message)
    }

    /// Queue the set on the current backend (or fail as injected), the tensors landing
    /// inside `message`: one frame on the single-frame entry point (its per-encoding
    /// kernel), a batch as one operation; inside the NVTX range `frame N` (`batch N`).
    fn launch(
        &mut self,
        images: &[Option<&ImageView<'_>>],
        message: &mut MessageBuf,
    ) -> Result<Queued> {
        let (set, batch) = (self.recovery.frame, self.config.is_batch());
        let _range = crate::nvtx::push_with(|| crate::nvtx::frame_name(set, images.len(), batch));
        #[cfg(feature = "fault-injection")]
        if let Some(kind) =
            self.recovery.injection.due(self.recovery.frame, self.recovery.fell_back)
        {
            let armed = kind == FaultKind::InFlight && self.backend.arm_in_flight_fault();
            if !armed {
                return Err(self.backend.inject_fault(kind));
            }
        }
        let Some(pad) = self.pad_op.as_ref() else {
            return Err(Error::Operation("no pad operation".into()));
        };
        let out = message.prepare(self.backend.as_mut())?;
        let (host, len) = (out.as_mut_ptr(), out.len());
        let fill = message.fill;
        let out = match message.block.as_mut().map(|b| b.memory()) {
            None => backend::Out::Host { ptr: host, len },
            Some(None) => {
                return Err(Error::Operation("the shared block's pool was closed".into()));
            }
            Some(Some(m)) if m.len() < len => {
                return Err(Error::Operation(format!(
                    "the shared block holds {} bytes but the tensors are {len}",
                    m.len()
                )));
            }
            Some(Some(BlockMemory::Host(bytes))) => {
                backend::Out::Host { ptr: bytes.as_mut_ptr(), len }
            }
            Some(Some(BlockMemory::Device(ptr, _, event))) => backend::Out::Device {
                ptr,
                len,
                host: fill.then_some(host),
                ready: event.map(|e| e.raw),
            },
        };
        let conv = self.conv.as_ref();
        // `out` is the data of `message`'s buffer and/or its block's memory (host mapping
        // or device memory, which the block's lease keeps alive and which only its lease
        // holder writes), which the pipeline keeps in `pending` (or the caller of
        // `run_again` holds) without touching it until this submission is finished or
        // abandoned; a buffer is released (and a backend replaced, device blocks released
        // first) only after `abandon_all` or `finish_oldest`: the contract of `submit_to`.
        if !self.config.is_batch() {
            return match (images.first(), self.cached.first()) {
                // SAFETY: `out` as said above.
                (Some(Some(image)), Some(Some((_, _, op)))) => unsafe {
                    self.backend.submit_to(Job::Frame { image, op }, conv, out)
                },
                _ => Err(Error::Operation("no operation for this frame size".into())),
            };
        }
        let slots: Vec<backend::BatchSlot<'_, '_>> = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                let op = match (image, self.cached.get(i)) {
                    (Some(_), Some(Some((_, _, op)))) => op,
                    _ => pad,
                };
                backend::BatchSlot { image: *image, op }
            })
            .collect();
        // SAFETY: `out` as said above.
        unsafe { self.backend.submit_to(Job::Batch(&slots), conv, out) }
    }

    /// Replace the backend. The message buffer goes first: it may be pinned memory that
    /// keeps the old backend's CUDA context alive. Returns how many messages taken out
    /// on the old backend's buffers were still not dropped after [`OUTSTANDING_WAIT`]
    /// (normally 0).
    fn replace_backend(&mut self, backend: Box<dyn Backend>) -> usize {
        self.backend.abandon_all();
        self.abandon_pending();
        for p in &mut self.pending {
            p.message.release();
            // A set the failed backend refused (its context was already faulted) runs
            // again on the new one, as the abandoned ones do.
            if matches!(&p.state, PendingState::Failed(e) if e.is_device_failure()) {
                p.state = PendingState::Abandoned;
            }
        }
        self.message.release();
        let left = self.pool.retire();
        // Its device blocks go before the backend (they keep its context alive).
        let pools =
            std::mem::take(&mut *self.device_pools.lock().unwrap_or_else(|p| p.into_inner()));
        for pool in pools.iter().filter_map(Weak::upgrade) {
            pool.release_device();
        }
        self.backend = backend;
        self.epoch += 1;
        left
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
                        Err(e) if e.is_device_failure() => {
                            last_error = format!("the frame again: {e}")
                        }
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

    /// The bytes of the last tensor(s) (little-endian, dense in their layout; a batch's
    /// items one after the other).
    pub fn tensor_bytes(&self) -> &[u8] {
        self.message.tensor()
    }

    /// The serialized `vision_preproc_msgs/Tensor` (or `TensorBatch`) of the last frame
    /// set (CDR, what the typed publisher would send), see [`Pipeline::process_frames`].
    pub fn message(&self) -> &[u8] {
        self.message.message()
    }

    /// The last tensor(s) de-normalized to an 8-bit image (see [`preview`]; a batch's
    /// items stacked top to bottom).
    pub fn preview_image(&self) -> Result<PreviewImage> {
        self.message.preview()
    }
}

/// The items of a batch as kept in its message until the ages are known.
/// The frames the backend runs: each item's, unless its slot has no geometry (padded).
fn images_of<'a, 'b>(
    items: &[FrameInput<'a, 'b>],
    geometries: &[Option<Geometry>],
) -> Vec<Option<&'b ImageView<'a>>> {
    items.iter().zip(geometries).map(|(it, g)| g.as_ref().and(it.image)).collect()
}

fn kept_items(items: &[FrameInput<'_, '_>], geometries: &[Option<Geometry>]) -> Vec<KeptItem> {
    items
        .iter()
        .zip(geometries)
        .map(|(it, g)| {
            let valid = g.is_some();
            KeptItem {
                topic: it.topic.to_string(),
                valid,
                repeated: valid && it.repeated,
                header: if valid { it.header.clone() } else { Header::default() },
                source_encoding: if valid { it.source_encoding.to_string() } else { String::new() },
                geometry: g.clone(),
            }
        })
        .collect()
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

/// [`preview`] of each of the tensors in `tensors` (one or a batch's items, all written
/// by `params`), stacked top to bottom: one image `width` wide and `n * height` high.
pub fn preview_items(params: &PreprocessParams, tensors: &[u8]) -> Result<PreviewImage> {
    let one = params.tensor_desc().byte_len();
    if one == 0 || tensors.len() % one != 0 {
        return Err(Error::Operation(format!(
            "{} tensor bytes are not a whole number of {one}-byte tensors",
            tensors.len()
        )));
    }
    let mut items = tensors.chunks_exact(one).map(|t| preview(params, t));
    let Some(mut out) = items.next() else {
        return Err(Error::Operation("no tensor to show".into()));
    };
    for item in items {
        out.height += item.height;
        out.data.extend_from_slice(&item.data);
    }
    Ok(out)
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
    #[cfg(feature = "fault-injection")]
    if cfg.backend == BackendChoice::Cpu {
        if let Some(deferred) = deferred::Deferred::from_env() {
            return Ok((Box::new(deferred), None));
        }
    }
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
    use crate::wire::msgs::{Tensor, TensorBatch};
    use std::time::Duration;

    fn pipeline(inputs: &[&str]) -> Pipeline {
        let cfg = Config {
            network_image_width: 16,
            network_image_height: 8,
            inputs: inputs.iter().map(|t| t.to_string()).collect(),
            ..Config::default()
        };
        Pipeline::new(cfg, Box::new(CpuBackend::new())).expect("pipeline")
    }

    const TOPICS: [&str; 2] = ["a/image", "b/image"];

    #[test]
    fn the_output_size_derived_once_is_the_pad_operations() {
        // Config::tensor_bytes sizes the pipeline's output and the node's DDS segment; the
        // pad operation's tensor is what the backends write: the same bytes, any shape.
        use crate::config::{DType, Layout};
        for (w, h, channels, dtype, layout, inputs) in [
            (640, 480, 3, DType::Float32, Layout::Nchw, &[][..]),
            (61, 37, 3, DType::Float16, Layout::Nhwc, &["x"][..]),
            (320, 320, 1, DType::Float32, Layout::Nhwc, &TOPICS[..]),
            (17, 5, 3, DType::Float16, Layout::Nchw, &["a", "b", "c"][..]),
        ] {
            let cfg = Config {
                network_image_width: w,
                network_image_height: h,
                output_channels: channels,
                output_dtype: dtype,
                output_layout: layout,
                inputs: inputs.iter().map(|t| t.to_string()).collect(),
                image_mean: vec![0.5; channels as usize],
                image_stddev: vec![0.25; channels as usize],
                ..Config::default()
            };
            let items = if inputs.len() >= 2 { inputs.len() } else { 1 };
            let op = pad_op(&cfg).expect("pad op");
            assert_eq!(cfg.tensor_bytes(), op.params.tensor_desc().byte_len() * items, "{w}x{h}");
            let p = Pipeline::new(cfg, Box::new(CpuBackend::new())).expect("pipeline");
            assert_eq!(p.output_bytes(), op.params.tensor_desc().byte_len() * items);
        }
    }

    /// One 8x4 rgb8 frame per topic, pixels `v + camera index` (a batch of one with one
    /// topic).
    fn frames(p: &mut Pipeline, topics: &[&str], v: u8, stamp: i32) -> Result<Processed> {
        with_inputs(topics, v, stamp, |inputs, header| p.process_frames(inputs, header))
    }

    #[test]
    fn a_taken_message_stays_while_the_next_batch_is_written_and_its_buffer_comes_back() {
        let mut p = pipeline(&TOPICS);
        frames(&mut p, &TOPICS, 10, 1).expect("batch 1");
        let first = p.message().to_vec();
        let mut taken = p.take_message();
        assert_eq!(taken.bytes(), &first[..]);
        frames(&mut p, &TOPICS, 200, 2).expect("batch 2");
        let second = p.message().to_vec();
        assert_ne!(second, first, "the second batch went into another buffer");
        assert_eq!(taken.bytes(), &first[..], "the taken message is untouched");
        // Ages are written into the taken message; everything else stays.
        taken.set_ages(&[5.0, 7.0]).expect("ages");
        let (before, after) = (
            TensorBatch::decode(&first).expect("decode"),
            TensorBatch::decode(taken.bytes()).expect("decode"),
        );
        assert_eq!(before.items.iter().map(|i| i.age_us).collect::<Vec<_>>(), [0.0, 0.0]);
        assert_eq!(after.items.iter().map(|i| i.age_us).collect::<Vec<_>>(), [5.0, 7.0]);
        assert_eq!(
            (after.data, &after.shape, after.header),
            (before.data, &before.shape, before.header)
        );
        assert_eq!(p.pool.counts(), (1, 0));
        drop(taken);
        assert_eq!(p.pool.counts(), (0, 1), "the buffer came back for the next take");
        let _second_taken = p.take_message();
        assert_eq!(p.pool.counts(), (1, 0), "...and was reused");
    }

    #[test]
    fn a_replaced_backend_frees_the_buffers_of_its_messages() {
        let mut p = pipeline(&TOPICS);
        frames(&mut p, &TOPICS, 10, 1).expect("batch");
        let taken = p.take_message();
        let publisher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50)); // publishing
            drop(taken);
        });
        // The replacement waits for the message being published, then frees its buffer
        // instead of taking it back.
        let left = p.replace_backend(Box::new(CpuBackend::new()));
        assert_eq!(left, 0);
        assert_eq!(p.pool.counts(), (0, 0), "no buffer of the old backend kept");
        publisher.join().expect("publisher");
        frames(&mut p, &TOPICS, 10, 2).expect("a batch on the new backend");
    }

    /// Frames of `topics` (8x4 rgb8, pixels `v + camera index`) as the pipeline's inputs,
    /// given to `f`.
    fn with_inputs<T>(
        topics: &[&str],
        v: u8,
        stamp: i32,
        f: impl FnOnce(&[FrameInput<'_, '_>], &Header) -> T,
    ) -> T {
        let data: Vec<Vec<u8>> = (0..topics.len()).map(|i| vec![v + i as u8; 8 * 4 * 3]).collect();
        let images: Vec<ImageView<'_>> = data
            .iter()
            .map(|d| ImageView::new(8, 4, 24, "rgb8", false, d).expect("image"))
            .collect();
        let header = Header { sec: stamp, nanosec: 0, frame_id: "cam".into() };
        let inputs: Vec<FrameInput<'_, '_>> = topics
            .iter()
            .zip(&images)
            .map(|(topic, image)| FrameInput {
                topic,
                image: Some(image),
                header: &header,
                source_encoding: "rgb8",
                repeated: false,
            })
            .collect();
        f(&inputs, &header)
    }

    #[test]
    fn two_sets_in_flight_finish_in_order_each_as_if_alone() {
        for topics in [&["image"][..], &TOPICS[..]] {
            // What each set gives alone (synchronous CPU).
            let mut alone = pipeline(if topics.len() > 1 { topics } else { &[] });
            let want: Vec<Vec<u8>> = [(10, 1), (90, 2), (200, 3)]
                .iter()
                .map(|&(v, t)| {
                    frames(&mut alone, topics, v, t).expect("alone");
                    alone.message().to_vec()
                })
                .collect();
            let cfg = alone.config().clone();
            let deferred = deferred::Deferred::new();
            let mut p = Pipeline::new(cfg, Box::new(deferred)).expect("pipeline");
            assert_eq!(p.max_in_flight(), 2);
            with_inputs(topics, 10, 1, |i, h| p.submit_frames(i, h)).expect("submit 1");
            with_inputs(topics, 90, 2, |i, h| p.submit_frames(i, h)).expect("submit 2");
            let third = with_inputs(topics, 200, 3, |i, h| p.submit_frames(i, h)).unwrap_err();
            assert!(third.to_string().contains("finish_frames first"), "{third}");
            assert_eq!(p.in_flight(), 2);
            with_inputs(topics, 10, 1, |i, _| p.finish_frames(i)).expect("finish 1");
            let first = p.take_message();
            assert_eq!(first.bytes(), &want[0][..], "{topics:?}: set 1");
            with_inputs(topics, 200, 3, |i, h| p.submit_frames(i, h)).expect("submit 3");
            with_inputs(topics, 90, 2, |i, _| p.finish_frames(i)).expect("finish 2");
            assert_eq!(p.message(), &want[1][..], "{topics:?}: set 2");
            with_inputs(topics, 200, 3, |i, _| p.finish_frames(i)).expect("finish 3");
            assert_eq!(p.message(), &want[2][..], "{topics:?}: set 3");
            assert_eq!(first.bytes(), &want[0][..], "the taken message stayed");
            assert!(p.finish_frames(&[]).is_err(), "nothing in flight");
            let busy = with_inputs(topics, 10, 4, |i, h| {
                p.submit_frames(i, h).expect("submit");
                p.process_frames(i, h).unwrap_err()
            });
            assert!(busy.to_string().contains("finish_frames first"), "{busy}");
        }
    }

    #[test]
    fn one_input_is_a_tensor_and_each_batch_item_is_that_tensor() {
        let mut single = pipeline(&[]);
        let info = frames(&mut single, &["image"], 10, 1).expect("single");
        let msg = single.take_message();
        let tensor = Tensor::decode(msg.bytes()).expect("a Tensor");
        assert_eq!(tensor.data, msg.tensor());
        assert_eq!(info.geometries.len(), 1);
        let mut batched = pipeline(&TOPICS);
        frames(&mut batched, &TOPICS, 10, 1).expect("batch");
        let batch = TensorBatch::decode(batched.message()).expect("a TensorBatch");
        assert_eq!(&batch.data[..tensor.data.len()], tensor.data, "item 0 = the single tensor");
        assert_eq!(batch.shape[0], 2);
    }

    #[test]
    fn the_preview_of_a_batch_stacks_its_items() {
        let mut single = pipeline(&[]);
        frames(&mut single, &["image"], 10, 1).expect("single");
        let one = single.preview_image().expect("preview");
        assert_eq!((one.width, one.height, one.channels), (16, 8, 3));
        let mut batched = pipeline(&TOPICS);
        frames(&mut batched, &TOPICS, 10, 1).expect("batch");
        let taken = batched.take_message();
        let both = taken.preview().expect("preview");
        assert_eq!((both.width, both.height), (16, 16));
        assert_eq!(&both.data[..one.data.len()], &one.data[..], "item 0 on top");
        assert_ne!(&both.data[one.data.len()..], &one.data[..], "item 1 (pixels + 1) below");
    }
}
