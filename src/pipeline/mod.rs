//! The pipeline: turns a validated [`Config`] and each frame's size into the backend's
//! operations (cached per input slot and frame size, `ops.rs`), selects the backend and
//! replaces it when it fails (`failure.rs`), and runs the frames of one input set — one
//! frame for a single camera, one per camera for a batch — into the serialized output
//! message (`Tensor` with one input, `TensorBatch` with 2+), with each frame's geometry
//! and the stage timing. One path for 1 and N inputs: a single camera is a batch of one;
//! only the backend entry point differs (one frame keeps its per-encoding kernel, a batch
//! is one launch). [`Pipeline::process_frames`] runs one set; [`InFlight`] keeps sets in
//! flight (set k+1 staged while set k computes) and owns them until they are finished.

pub mod conv;
#[cfg(any(test, feature = "fault-injection"))]
pub mod deferred;
pub(crate) mod encode;
pub(crate) mod failure;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub(crate) mod geometry;
pub(crate) mod inflight;
pub(crate) mod message;
mod ops;
pub(crate) mod preview;

use crate::backend::{
    self, Backend, BatchWork, Frame, FrameWork, Job, Queued, StageTimes, TensorDesc,
};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::handoff::{BlockMemory, Pool};
use crate::image::ImageView;
use crate::wire::msgs::Header;
pub use encode::frame_timing;
pub(crate) use encode::{TensorBatchFields, TensorCdr, TensorFields};
pub(crate) use failure::BackendOpener;
use failure::Recovery;
pub use failure::{
    open_backend, select_backend, FailureAction, GpuFailure, GPU_RETRY_ATTEMPTS,
    GPU_RETRY_RESET_FRAMES,
};
#[cfg(feature = "fault-injection")]
pub use fault::{FaultKind, FaultPlan};
pub use geometry::{Geometry, Rect};
pub use inflight::{Announce, Finished, FrameSet, InFlight, Outputs};
use inflight::{NoOthers, Others, Pending, PendingState};
pub use message::OwnedMessage;
pub(crate) use message::OUTSTANDING_WAIT;
use message::{batch_fields, MessageBuf, MessagePool};
pub use ops::{conv_op, preprocess_op};
use ops::{images_of, kept_items, Ops};
pub(crate) use preview::preview_items;
pub use preview::{preview, PreviewImage};
use std::sync::{Arc, Mutex, Weak};

/// A received frame, checked, as the pipeline takes it and owns it while a set is formed:
/// pixel rows, or a compressed frame whose headers were read (the backend decodes it).
/// [`FrameView::frame`] lends it as the backend's [`Frame`]. (The node's inputs and
/// `vision_preproc replay` both hold their frames this way.)
#[derive(Debug, Clone, Copy)]
pub enum FrameView<'a> {
    /// Pixel rows.
    Pixels(ImageView<'a>),
    /// A compressed frame.
    Compressed(crate::compressed::Compressed<'a>),
    /// Pixel rows in device memory (a hardware decoder's CUDA memory).
    Device(crate::image::DeviceView<'a>),
}

impl<'a> FrameView<'a> {
    /// The backend's frame.
    pub fn frame(&self) -> Frame<'a, '_> {
        match self {
            FrameView::Pixels(v) => Frame::Pixels(v),
            FrameView::Compressed(c) => Frame::Compressed(c),
            FrameView::Device(d) => Frame::Device(d),
        }
    }
}

/// One input of a frame set ([`Pipeline::process_frames`], [`FrameSet`]): a camera's
/// frame (or none).
#[derive(Debug, Clone, Copy)]
pub struct FrameInput<'a, 'b> {
    /// The input topic (resolved; written into a `TensorBatch`'s item).
    pub topic: &'b str,
    /// The frame (pixels, or a compressed frame the backend decodes), or `None` (camera
    /// stale, frame invalid): a batch slot is padded.
    pub image: Option<Frame<'a, 'b>>,
    /// Header of the frame.
    pub header: &'b Header,
    /// Encoding as it arrived (`yuv422_yuy2`, not its alias).
    pub source_encoding: &'b str,
    /// The frame was in an earlier batch.
    pub repeated: bool,
}

impl<'a, 'b> FrameInput<'a, 'b> {
    /// A single camera's frame.
    pub fn frame(
        image: impl Into<Frame<'a, 'b>>,
        header: &'b Header,
        source_encoding: &'b str,
    ) -> Self {
        let image = Some(image.into());
        FrameInput { topic: "", image, header, source_encoding, repeated: false }
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

/// One processed frame set. Its message: [`Finished::result`], or after
/// [`Pipeline::process_frames`] the pipeline's ([`Pipeline::message`],
/// `Pipeline::take_message`).
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

/// Batch slots refused: (slot, reason).
pub type Rejected = Vec<(usize, String)>;

/// Builds the operations for each input's frame size and runs them on a backend.
pub struct Pipeline {
    config: Config,
    backend: Box<dyn Backend>,
    ops: Ops,
    /// The message of the set finished last ([`Pipeline::message`]).
    message: MessageBuf,
    /// Buffers of messages taken out ([`Pipeline::take_message`]) and given back.
    pool: Arc<MessagePool>,
    recovery: Recovery,
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
        let ops = Ops::new(&config)?;
        let recovery = Recovery::new(&config);
        #[cfg(feature = "fault-injection")]
        let recovery =
            Recovery { injection: fault::Injection::new(FaultPlan::from_env()?), ..recovery };
        Ok(Pipeline {
            config,
            backend,
            ops,
            message: MessageBuf::default(),
            pool: Arc::default(),
            recovery,
            device_pools: Mutex::default(),
            epoch: 0,
        })
    }

    /// Test hook (feature `fault-injection`): make the backend fail as `plan` says (what
    /// `INJECT_FAULT_ENV` does), counting frames from the next one as frame 1.
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
    pub(crate) fn set_config(&mut self, config: Config) -> Result<()> {
        config.validate()?;
        self.ops = Ops::new(&config)?;
        self.config = config;
        Ok(())
    }

    /// Process one frame (a single camera, no header). The tensor's bytes are in
    /// [`Pipeline::tensor_bytes`] until the next call (and in [`Pipeline::message`]).
    pub fn process(&mut self, image: &ImageView<'_>) -> Result<FrameInfo> {
        let header = Header::default();
        let p =
            self.process_frames(&[FrameInput::frame(image, &header, image.encoding().name())])?;
        let geometry =
            p.geometries.into_iter().flatten().next().ok_or_else(|| {
                Error::misuse("process", "the frame was padded instead of processed")
            })?;
        Ok(FrameInfo { desc: p.desc, geometry, times: p.times, gpu_failure: p.gpu_failure })
    }

    /// Process the frames of one input set into the serialized output message: with one
    /// input (`inputs` has fewer than 2 topics) a `vision_preproc_msgs/Tensor` of
    /// `items[0]` (which must have a frame; a frame the configuration refuses is an
    /// error), with 2+ a `TensorBatch` whose slot i is `items[i]`, each exactly what one
    /// input would give, a slot without a frame (or whose frame the configuration
    /// refuses, e.g. the roi) padded and flagged invalid, its header [`set_header`]'s.
    /// Until the next call [`Pipeline::message`] holds the message (a batch's ages 0
    /// until `OwnedMessage::set_ages`) and [`Pipeline::tensor_bytes`] its tensors.
    /// Sets in flight, one after another: [`InFlight`].
    pub fn process_frames(&mut self, items: &[FrameInput<'_, '_>]) -> Result<Processed> {
        let pending = self.submit(items, Outputs::message(), &mut NoOthers)?;
        self.finish(pending, items, &mut NoOthers)
    }

    /// How many sets may be submitted and not finished at once: the backend's
    /// [`Backend::max_in_flight`] (2 on CUDA: set k+1 is staged and uploaded while set k
    /// computes; 1 on the CPU, which computes a set when it is submitted).
    pub fn max_in_flight(&self) -> usize {
        self.backend.max_in_flight().max(1)
    }

    /// Bytes of one set's tensors (a batch: all its items), as configured now
    /// ([`Config::tensor_bytes`]).
    pub fn output_bytes(&self) -> usize {
        self.config.tensor_bytes()
    }

    /// Take the last message out, to publish it on another thread; the next frame set
    /// goes into another buffer (one given back, or a new one). Dropping the message
    /// gives its buffer back. After this, [`Pipeline::message`] is not that message any
    /// more.
    pub(crate) fn take_message(&mut self) -> OwnedMessage {
        self.pool.take(&mut self.message)
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

    /// The last tensor(s) de-normalized to an 8-bit image (see [`preview()`]; a batch's
    /// items stacked top to bottom).
    pub fn preview_image(&self) -> Result<PreviewImage> {
        self.message.preview()
    }

    /// The first half of a set: resolve its operations, write its message around the
    /// tensors (into `outputs`' block, if any) and queue the backend's work (the frames
    /// are staged: they may go when this returns, but are needed again by
    /// [`Pipeline::finish`], which runs the set again if the backend fails). Errors: the
    /// set is refused (a single camera's frame that the configuration refuses, an
    /// operation error); nothing was queued. A device error is not returned here: the
    /// set's finish handles it (`gpu_failure_policy`), and `others` in flight are
    /// abandoned (each runs again at its finish).
    fn submit(
        &mut self,
        items: &[FrameInput<'_, '_>],
        outputs: Outputs,
        others: &mut dyn Others,
    ) -> Result<Pending> {
        let batch = self.config.is_batch();
        if items.is_empty() || (!batch && items.len() != 1) {
            let (n, inputs) = (items.len(), self.config.input_count());
            return Err(Error::misuse(
                "submit",
                format!("{n} frames for a pipeline of {inputs} input(s)"),
            ));
        }
        let (geometries, rejected) = self.ops.resolve(&self.config, items)?;
        let params = self.ops.params(&self.config)?;
        let desc = params.tensor_desc();
        let header = set_header(items);
        let mut message = self.pool.spare();
        message.cdr = if batch {
            message.items = kept_items(items, &geometries);
            TensorCdr::batch(&TensorBatchFields {
                header: &header,
                name: &self.config.tensor_name,
                desc,
                items: &batch_fields(&message.items, &[]),
            })
        } else {
            message.items.clear();
            let (item, geometry) = (&items[0], geometries[0].as_ref());
            let geometry = geometry
                .ok_or_else(|| Error::misuse("submit", "a single frame without a geometry"))?;
            TensorCdr::new(&TensorFields {
                header: item.header,
                name: &self.config.tensor_name,
                desc,
                geometry,
                source_encoding: item.source_encoding,
            })
        };
        message.params = Some(params);
        if outputs.block.is_some() {
            message.block_header = header;
            message.name.clone_from(&self.config.tensor_name);
            message.block_items = if batch { Vec::new() } else { kept_items(items, &geometries) };
        }
        message.block = outputs.block;
        message.fill = outputs.fill;
        let images = images_of(items, &geometries);
        self.recovery.frame += 1;
        let state = match self.launch(&images, &mut message) {
            Ok(Queued::Done(times)) => PendingState::Done(times),
            Ok(Queued::Pending) => PendingState::InFlight,
            Err(e) if e.is_device_failure() => {
                // Nothing in flight survives a device error (an injected fault never
                // reached the backend: it is told too).
                self.backend.abandon_all();
                failure::abandon(others);
                PendingState::Failed(e)
            }
            Err(e) => {
                self.pool.give_back(message);
                return Err(e);
            }
        };
        let set = self.recovery.frame;
        Ok(Pending { set, message, desc, geometries, rejected, state })
    }

    /// The second half of a set: wait for the set `p` (the oldest submitted; `items`
    /// its frames, as submitted) and make its message the pipeline's
    /// ([`Pipeline::message`], [`Pipeline::take_message`]). A device error starts
    /// `gpu_failure_policy` on this set (run again on the rebuilt or fallback backend);
    /// `others`, submitted after it, run again at their own finish.
    fn finish(
        &mut self,
        mut p: Pending,
        items: &[FrameInput<'_, '_>],
        others: &mut dyn Others,
    ) -> Result<Processed> {
        let result = match std::mem::replace(&mut p.state, PendingState::Abandoned) {
            PendingState::Done(times) => Ok(times),
            PendingState::InFlight => {
                let (set, items, batch) = (p.set, items.len(), self.config.is_batch());
                let _range = crate::nvtx::push_with(|| crate::nvtx::frame_name(set, items, batch));
                let r = self.backend.finish_oldest();
                if r.as_ref().is_err_and(Error::is_device_failure) {
                    failure::abandon(others);
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
                let (times, failure) = self.recover(e.to_string(), others, &mut |pl, _| {
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

    /// Run a set again, now, on the current backend (after a failure): its operations
    /// resolved again for `items` (the cache may hold a later set's sizes) and the
    /// tensors written into `message` (allocated from the current backend).
    fn run_again(
        &mut self,
        items: &[FrameInput<'_, '_>],
        message: &mut MessageBuf,
    ) -> Result<StageTimes> {
        let (geometries, _) = self.ops.resolve(&self.config, items)?;
        let images = images_of(items, &geometries);
        match self.launch(&images, message)? {
            Queued::Done(times) => Ok(times),
            Queued::Pending => self.backend.finish_oldest(),
        }
    }

    /// Queue the set on the current backend (or fail as injected), the tensors landing
    /// inside `message`: one frame on the single-frame entry point (its per-encoding
    /// kernel), a batch as one operation; inside the NVTX range `frame N` (`batch N`).
    fn launch(
        &mut self,
        images: &[Option<Frame<'_, '_>>],
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
        let pad = self.ops.pad()?;
        let out = output_of(message, self.backend.as_mut())?;
        let conv = self.ops.conv();
        // `out` is the data of `message`'s buffer and/or its block's memory (host mapping
        // or device memory, which the block's lease keeps alive and which only its lease
        // holder writes), which the pipeline keeps in its pending set (or the caller
        // of `run_again` holds) without touching it until this submission is finished or
        // abandoned; a buffer is released (and a backend replaced, device blocks released
        // first) only after `abandon_all` or `finish_oldest`: the contract of `submit_to`.
        // A lent frame's memory (`ImageView::lent`, read in place by a GPU backend) is its
        // set's, which `InFlight` keeps until the set is finished (`process_frames` and a
        // run again finish it before they return).
        if !self.config.is_batch() {
            return match (images.first(), self.ops.frame_op(0)) {
                // SAFETY: `out` as said above.
                (Some(Some(image)), Some(op)) => unsafe {
                    self.backend.submit_to(Job::Frame(FrameWork::new(*image, op, conv)), out)
                },
                _ => Err(Error::misuse("submit", "no operation for this frame size")),
            };
        }
        let slots: Vec<backend::BatchSlot<'_, '_>> = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                let op = match (image, self.ops.frame_op(i)) {
                    (Some(_), Some(op)) => op,
                    _ => pad,
                };
                backend::BatchSlot { image: *image, op }
            })
            .collect();
        // SAFETY: `out` as said above.
        unsafe { self.backend.submit_to(Job::Batch(BatchWork::new(&slots, conv)), out) }
    }
}

/// Where a submission of `message` writes its tensors: its buffer (prepared for
/// `backend`), or its shared block's memory (host, or device with the buffer filled too
/// when `fill`).
fn output_of(message: &mut MessageBuf, backend: &mut dyn Backend) -> Result<backend::Out> {
    let out = message.prepare(backend)?;
    let (host, len) = (out.as_mut_ptr(), out.len());
    let fill = message.fill;
    match message.block.as_mut().map(|b| b.memory()) {
        None => Ok(backend::Out::Host { ptr: host, len }),
        Some(None) => Err(Error::misuse("submit", "the shared block's pool was closed")),
        Some(Some(m)) if m.len() < len => Err(Error::misuse(
            "submit",
            format!("the shared block holds {} bytes but the tensors are {len}", m.len()),
        )),
        Some(Some(BlockMemory::Host(bytes))) => {
            Ok(backend::Out::Host { ptr: bytes.as_mut_ptr(), len })
        }
        Some(Some(BlockMemory::Device(ptr, _, event))) => Ok(backend::Out::Device {
            ptr,
            len,
            host: fill.then_some(host),
            ready: event.map(|e| e.raw),
        }),
    }
}

#[cfg(test)]
mod tests;
