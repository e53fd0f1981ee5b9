//! The pipeline's message buffers: the serialized output message of a frame or a batch
//! (`Tensor` or `TensorBatch`, laid out by [`super::encode`]) in memory from the backend
//! ([`Backend::alloc_host`]: pinned for CUDA), the backend writing the tensor in place
//! between the message's two parts. A finished message is taken out as an
//! [`OwnedMessage`] to be published on another thread while the next one is written into
//! another buffer; dropping it gives the buffer back to the pool, unless the backend was
//! replaced meanwhile (then it is freed: pinned memory keeps its CUDA context alive, and
//! a faulted context must go before a new one can be made).

use super::encode::{batch_items_cdr, tensor_ref_cdr, BatchItemFields, BlockFields, TensorCdr};
use super::{preview_items, Geometry, PreviewImage};
use crate::backend::{Backend, HostBuffer, PreprocessParams};
use crate::error::{Error, Result};
use crate::handoff::Lease;
use crate::wire::msgs::Header;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Alignment of the tensor data inside the message buffer (the CUDA kernels' vector
/// stores need 16 bytes when they write it directly; 64 keeps it on a cache line).
pub(crate) const TENSOR_ALIGN: usize = 64;

/// Spare bytes allocated with the message buffer, so that small changes of the message
/// (a longer frame_id) do not reallocate it.
const MESSAGE_SLACK: usize = 4096;

/// How long a backend replacement waits for the messages still being published from
/// another thread to be dropped (normally one publish: milliseconds).
pub(crate) const OUTSTANDING_WAIT: Duration = Duration::from_secs(2);

/// The fields of a batch's item kept until its age is known ([`OwnedMessage::set_ages`]).
#[derive(Debug, Clone, Default)]
pub(super) struct KeptItem {
    pub topic: String,
    pub valid: bool,
    pub repeated: bool,
    pub header: Header,
    pub source_encoding: String,
    pub geometry: Option<Geometry>,
}

/// One serialized message in a buffer, and what is needed to finish it (a batch's items,
/// for their ages) and to show it (the parameters that wrote its tensors, for
/// `debug_image`).
#[derive(Default)]
pub(super) struct MessageBuf {
    buf: Option<HostBuffer>,
    /// Offset of the message in `buf` (so that its data is [`TENSOR_ALIGN`]ed).
    start: usize,
    /// The message's layout around its data.
    pub cdr: TensorCdr,
    /// A `TensorBatch`'s items (empty for a `Tensor`).
    pub items: Vec<KeptItem>,
    /// The operation parameters of the tensors in the message (their size, layout, dtype
    /// and normalization), once one was written.
    pub params: Option<PreprocessParams>,
    /// The shared block the tensors are written into instead of the message
    /// (`tensor_ref`, docs/HANDOFF.md), with the items its `TensorRef` describes (a
    /// single camera's one; a batch's are `items`).
    pub block: Option<Lease>,
    pub block_items: Vec<KeptItem>,
    /// The set's header and `tensor_name`, for the `TensorRef`.
    pub block_header: Header,
    pub name: String,
    /// With a block: the tensors are also copied into the message at the set's finish
    /// (`tensor` has subscribers); without, the message's data is never written.
    pub fill: bool,
}

impl MessageBuf {
    /// Make room for the message `cdr` describes (allocating from `backend` if needed)
    /// and write everything but the data; returns the data's bytes.
    pub(super) fn prepare(&mut self, backend: &mut dyn Backend) -> Result<&mut [u8]> {
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
            return Err(Error::misuse(
                "prepare",
                "the message buffer is missing after its allocation",
            ));
        };
        self.start = offset(buf);
        let message = &mut buf.as_mut_slice()[self.start..self.start + need];
        self.cdr.write_around(message);
        Ok(&mut message[self.cdr.data_range()])
    }

    /// Free the buffer (its backend is being replaced), and give back a block of device
    /// memory (its pool is released with the backend): the set then runs again into the
    /// message only.
    pub(super) fn release(&mut self) {
        self.buf = None;
        if self.block.as_ref().is_some_and(Lease::is_device) {
            self.block = None;
            self.fill = true;
        }
    }

    /// The `TensorRef` of the block (`None`: no block), with each item's age and the
    /// interprocess event a consumer waits on (empty: none).
    pub(super) fn tensor_ref(&self, ages: &[f32], ipc_event_handle: &[u8]) -> Option<Vec<u8>> {
        let block = self.block.as_ref()?;
        let desc = self.params.as_ref()?.tensor_desc();
        let batch = !self.items.is_empty();
        let items = if batch { &self.items } else { &self.block_items };
        let pool = block.pool();
        let fields = BlockFields {
            pool_id: pool.id(),
            socket_path: pool.socket_str(),
            index: block.index() as u32,
            size: pool.block_size() as u64,
            generation: block.generation(),
            memory_kind: pool.memory().code(),
            device_id: pool.device_info().0,
            device_uuid: pool.device_info().1,
            ipc_event_handle,
        };
        let items = batch_fields(items, ages);
        Some(tensor_ref_cdr(&self.block_header, &self.name, desc, batch, &fields, &items))
    }

    /// Write each batch item's `age_us` (0 for invalid items) into the message; nothing
    /// for a `Tensor`, which has no ages.
    fn set_ages(&mut self, ages: &[f32]) -> Result<()> {
        if self.items.is_empty() {
            return Ok(());
        }
        let body_offset = self.cdr.prefix.len() - 4 + self.cdr.data_len;
        let suffix = batch_items_cdr(body_offset, &batch_fields(&self.items, ages));
        if suffix.len() != self.cdr.suffix.len() {
            return Err(Error::misuse(
                "set_ages",
                format!(
                    "a message suffix of {} bytes cannot replace one of {}",
                    suffix.len(),
                    self.cdr.suffix.len()
                ),
            ));
        }
        let at = self.start + self.cdr.prefix.len() + self.cdr.data_len;
        if let Some(buf) = self.buf.as_mut() {
            buf.as_mut_slice()[at..at + suffix.len()].copy_from_slice(&suffix);
        }
        self.cdr.suffix = suffix;
        Ok(())
    }

    pub(super) fn message(&self) -> &[u8] {
        match &self.buf {
            Some(buf) => &buf.as_slice()[self.start..self.start + self.cdr.len()],
            None => &[],
        }
    }

    /// The tensors: the message's data, or the block's when they were not copied.
    pub(super) fn tensor(&self) -> &[u8] {
        match &self.block {
            Some(b) if !self.fill => b.bytes().get(..self.cdr.data_len).unwrap_or(&[]),
            _ => self.message().get(self.cdr.data_range()).unwrap_or(&[]),
        }
    }

    /// The set is finished: copy the tensors from a host block into the message when it
    /// has both and the message is wanted (a device block's were downloaded into the
    /// message by the backend).
    pub(super) fn fill_from_block(&mut self) {
        let (Some(block), Some(buf), true) = (&self.block, self.buf.as_mut(), self.fill) else {
            return;
        };
        if block.is_device() {
            return;
        }
        let range = self.cdr.data_range();
        let (at, len) = (self.start + range.start, range.len());
        if let Some(src) = block.bytes().get(..len) {
            buf.as_mut_slice()[at..at + len].copy_from_slice(src);
        }
    }

    /// What the network sees of each tensor in the message, stacked top to bottom (from
    /// a device block, copied to the host for it, when the message does not hold them).
    pub(super) fn preview(&self) -> Result<PreviewImage> {
        match (&self.params, &self.block) {
            (Some(params), Some(b)) if b.is_device() && !self.fill => {
                let mut bytes = vec![0u8; self.cdr.data_len];
                b.read_device(&mut bytes)?;
                preview_items(params, &bytes)
            }
            (Some(params), _) if !self.tensor().is_empty() => preview_items(params, self.tensor()),
            _ => {
                Err(Error::misuse("preview", "no frame has been processed yet; process one first"))
            }
        }
    }
}

/// The fields of `items` with their ages (0 for invalid items).
pub(super) fn batch_fields<'a>(items: &'a [KeptItem], ages: &[f32]) -> Vec<BatchItemFields<'a>> {
    items
        .iter()
        .enumerate()
        .map(|(i, k)| BatchItemFields {
            topic: &k.topic,
            valid: k.valid,
            repeated: k.repeated,
            header: &k.header,
            source_encoding: &k.source_encoding,
            geometry: k.geometry.as_ref(),
            age_us: if k.valid { ages.get(i).copied().unwrap_or(0.0) } else { 0.0 },
        })
        .collect()
}

/// Where the message buffers handed out by [`MessagePool::take`] come back to when
/// dropped; those of a backend replaced meanwhile are freed instead.
#[derive(Default)]
pub(super) struct MessagePool {
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

    /// A buffer for the next message: one given back, or a new empty one.
    pub(super) fn spare(&self) -> MessageBuf {
        self.free().pop().unwrap_or_default()
    }

    /// A buffer the pipeline no longer needs, kept for a later message (its block, if
    /// any, goes back to its pool).
    pub(super) fn give_back(&self, mut buf: MessageBuf) {
        buf.block = None;
        if buf.buf.is_some() {
            self.free().push(buf);
        }
    }

    /// Hand `current` out as an [`OwnedMessage`] and put a free buffer (one given back,
    /// or a new empty one) in its place.
    pub(super) fn take(self: &Arc<Self>, current: &mut MessageBuf) -> OwnedMessage {
        let next = self.free().pop().unwrap_or_default();
        let buf = std::mem::replace(current, next);
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        OwnedMessage {
            buf: Some(buf),
            generation: self.generation.load(Ordering::Acquire),
            pool: Arc::clone(self),
        }
    }

    /// The backend is being replaced: free the buffers given back, and wait (at most
    /// [`OUTSTANDING_WAIT`]) for those still being published, so that no buffer of the
    /// old backend outlives it. Returns how many were still out after the wait
    /// (normally 0).
    pub(super) fn retire(&self) -> usize {
        {
            let mut free = self.free();
            self.generation.fetch_add(1, Ordering::AcqRel);
            free.clear();
        }
        let deadline = Instant::now() + OUTSTANDING_WAIT;
        while self.outstanding.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.outstanding.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.outstanding.load(Ordering::Acquire), self.free().len())
    }
}

/// A finished message taken out of the pipeline (`super::Pipeline::take_message`) to be
/// published on another thread while the pipeline fills its next buffer. Dropping it
/// gives the buffer back to the pipeline.
pub struct OwnedMessage {
    buf: Option<MessageBuf>,
    generation: u64,
    pool: Arc<MessagePool>,
}

impl OwnedMessage {
    /// The serialized message.
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.message())
    }

    /// The tensor data of the message (all items of a batch); the block's when the
    /// message's data was not written.
    pub fn tensor(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.tensor())
    }

    /// The `TensorRef` of the shared block holding the tensors (`None`: no block, or it
    /// went out already, [`OwnedMessage::announced`]), with each item's age (`ages[i]`,
    /// as `OwnedMessage::set_ages`).
    pub fn tensor_ref(&self, ages: &[f32]) -> Option<Vec<u8>> {
        let buf = self.buf.as_ref()?;
        if buf.block.as_ref()?.announced() {
            return None;
        }
        buf.tensor_ref(ages, &[])
    }

    /// The set's `TensorRef` went out before its work ended
    /// ([`super::Announce::send`]).
    pub fn announced(&self) -> bool {
        self.buf.as_ref().and_then(|b| b.block.as_ref()).is_some_and(Lease::announced)
    }

    /// Send the block's `TensorRef` (`cdr`, just published) to the consumers on the
    /// ready signal ([`Lease::signal`]); nothing without a block.
    pub fn signal(&self, cdr: &[u8]) {
        if let Some(block) = self.buf.as_ref().and_then(|b| b.block.as_ref()) {
            block.signal(cdr);
        }
    }

    /// The block, taken out (to mark it published).
    pub fn take_block(&mut self) -> Option<Lease> {
        self.buf.as_mut()?.block.take()
    }

    /// The message holds the tensors' bytes (no block, or copied from it).
    pub fn has_bytes(&self) -> bool {
        self.buf.as_ref().is_some_and(|b| b.block.is_none() || b.fill)
    }

    /// Write each item's `age_us` (publish time minus its stamp; `ages[i]` for item i,
    /// ignored for invalid items) into a `TensorBatch`; a `Tensor` has no ages.
    pub(crate) fn set_ages(&mut self, ages: &[f32]) -> Result<()> {
        match self.buf.as_mut() {
            Some(buf) => buf.set_ages(ages),
            None => Err(given_back("set_ages")),
        }
    }

    /// What the network sees: the message's tensors de-normalized to 8-bit images (see
    /// [`super::preview()`]), a batch's items stacked top to bottom (item 0 on top).
    pub fn preview(&self) -> Result<PreviewImage> {
        match &self.buf {
            Some(buf) => buf.preview(),
            None => Err(given_back("preview")),
        }
    }
}

/// The error of a call on an [`OwnedMessage`] whose buffer went back to its pipeline.
fn given_back(call: &str) -> Error {
    Error::misuse(call, "the message was already given back to its pipeline")
}

impl Drop for OwnedMessage {
    fn drop(&mut self) {
        if let Some(mut buf) = self.buf.take() {
            // A block not taken out (its descriptor was not published) goes back to its
            // pool now.
            buf.block = None;
            // Under the pool's lock, as the generation changes (retire): a buffer is
            // either back before a replacement clears the pool or freed here.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_given_back_is_a_misuse_not_a_device_failure() {
        let pool = Arc::new(MessagePool::default());
        let mut current = MessageBuf::default();
        // A message never written: nothing to preview yet.
        let e = current.preview().unwrap_err();
        assert!(matches!(&e, Error::Misuse { call, .. } if call == "preview"), "{e:?}");
        let mut message = pool.take(&mut current);
        // Its buffer gone back to the pipeline (what dropping it does).
        drop(message.buf.take());
        for e in [message.set_ages(&[]).unwrap_err(), message.preview().unwrap_err()] {
            assert!(matches!(e, Error::Misuse { .. }) && !e.is_device_failure(), "{e:?}");
            assert!(e
                .to_string()
                .ends_with(": the message was already given back to its pipeline"));
        }
        drop(message);
        assert_eq!(pool.counts(), (0, 0));
    }
}
