//! The batch on the GPU ([`Backend::process_batch_into`](crate::backend::Backend)): the N
//! frames staged and uploaded, ONE launch of `resize_normalize_batch` for every slot
//! (grid z = slot; each slot's operation, frame, tables and output in one small device
//! table of [`BatchItemDesc`], so the cameras may differ in size and encoding), one
//! conv2d launch over the batch (grid z = slot, padded slots skipped), one download of
//! the N tensors: the steps of `steps.rs`, as the single frame (`frame.rs`). A padded
//! slot (stale camera) gets an empty content rectangle: the kernel writes pad[c]
//! everywhere and reads nothing. Two batches can be in flight ([`BATCH_RING`] entries):
//! [`CudaBackend::submit_batch`] / [`CudaBackend::finish_batch`], the pipelined form.

use super::kernels::RESIZE_NORMALIZE_BATCH;
use super::launch::{self, BatchItemDesc, MAX_BATCH_SLOTS};
use super::steps::{decode_jpegs, Entry, InFlight, Source, Tables, Target};
use super::{resident_blocks, CudaBackend};
use crate::backend::{BatchSlot, Conv2dOp, StageTimes};
use crate::compressed::Compressed;
use crate::config::{DType, Layout};
use crate::error::{CudaError, Error, Result};
use crate::image::Encoding;
use crate::launch_kernel;
use crate::nvtx::{self, Stage};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaContext;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Batches in flight at once through [`CudaBackend::submit_batch`].
pub(crate) const BATCH_RING: usize = 2;

/// Buffers of the batch path, reused from batch to batch (the frame's: `FrameState`).
pub(super) struct BatchState {
    /// [`BATCH_RING`] entries of one input per slot.
    ring: Vec<Entry>,
    /// Ring entries submitted and not yet finished, oldest first.
    queue: VecDeque<usize>,
    next: usize,
    /// Per slot: its sampling tables (on the compute stream, so in stream order with the
    /// kernels of both ring entries).
    tables: Vec<Tables>,
    resident: Option<u32>,
}

impl BatchState {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Self, CudaError> {
        Ok(BatchState {
            ring: (0..BATCH_RING).map(|_| Entry::new(ctx, 0)).collect::<Result<_, _>>()?,
            queue: VecDeque::new(),
            next: 0,
            tables: Vec::new(),
            resident: None,
        })
    }

    /// Forget every queued batch (both streams already waited for).
    pub(super) fn abandon(&mut self) {
        for r in self.queue.drain(..) {
            self.ring[r].in_flight = None;
        }
    }
}

/// The checks of a batch before anything is queued: caller errors, never device ones.
pub(super) fn check(slots: &[BatchSlot<'_, '_>], conv: Option<&Conv2dOp>) -> Result<()> {
    crate::backend::check_batch_shape(slots)?;
    for s in slots {
        s.image.map(Source::of).transpose()?;
    }
    if slots.len() > MAX_BATCH_SLOTS {
        return Err(Error::Operation(format!(
            "a batch of {} slots; the CUDA backend runs at most {MAX_BATCH_SLOTS} in one \
             launch (launch::MAX_BATCH_SLOTS): split the batch",
            slots.len()
        )));
    }
    conv.map_or(Ok(()), Conv2dOp::check)
}

impl CudaBackend {
    /// Queue a batch (the pipelined form of [`Backend::process_batch_into`]): the frames
    /// are staged into this batch's pinned buffers before it returns (the images may go),
    /// the upload runs on the copy stream, the kernels and the download on the compute
    /// stream. At most `BATCH_RING` batches may be queued; [`CudaBackend::finish_batch`]
    /// returns them in order. Submitting batch k+1 before finishing batch k is what
    /// overlaps k+1's staging and upload with k's kernels and download. A batch that
    /// fails its checks (an operation that does not fit its frame) or comes while the ring
    /// is full (`Error::Misuse`) is refused before anything is queued, and the queued
    /// batches stay; on any other error every queued batch is abandoned (both streams
    /// waited for).
    ///
    /// [`Backend::process_batch_into`]: crate::backend::Backend::process_batch_into
    pub fn submit_batch(
        &mut self,
        slots: &[BatchSlot<'_, '_>],
        conv: Option<&Conv2dOp>,
    ) -> Result<()> {
        check(slots, conv)?;
        self.gpu.bind()?;
        let result = self.batch_submit(slots, conv, None);
        self.abandon_on_error(result)
    }

    /// Wait for the oldest batch queued by [`CudaBackend::submit_batch`] and copy its N
    /// tensors into `out` (exactly their length: another is refused, the batch stays
    /// queued); its stage times (upload: host staging and the copy stream's upload;
    /// preprocess, conv, download: the compute stream's events, from when it started).
    pub fn finish_batch(&mut self, out: &mut [u8]) -> Result<StageTimes> {
        self.gpu.bind()?;
        let result = self.batch_finish(Some(out));
        self.abandon_on_error(result).map(|(times, ..)| times)
    }

    /// [`CudaBackend::finish_batch`] without the copy: the N tensors where the download
    /// left them (this batch's pinned output), valid until the next `submit_batch`.
    pub fn finish_batch_view(&mut self) -> Result<(StageTimes, &[u8])> {
        self.gpu.bind()?;
        let result = self.batch_finish(None);
        let (times, r, len) = self.abandon_on_error(result)?;
        // SAFETY: the batch's last event has completed, and the next write to this
        // buffer is queued by a later submit_batch, which needs `&mut self`, so not
        // while the returned borrow lives.
        Ok((times, &unsafe { self.batch.ring[r].output_bytes() }?[..len]))
    }

    /// Batches queued by [`CudaBackend::submit_batch`] and not yet finished.
    pub fn batches_in_flight(&self) -> usize {
        self.batch.queue.len()
    }

    /// `result`; after an error other than a caller's mistake (an operation that does not
    /// fit, a misuse: either leaves the queue as it was), first wait for both streams
    /// (queued work may still use the buffers or the caller's `out`) and forget every
    /// queued batch.
    pub(crate) fn abandon_on_error<T>(&mut self, result: Result<T>) -> Result<T> {
        match &result {
            Err(Error::Operation(_) | Error::Misuse { .. }) | Ok(_) => {}
            // A JPEG that nvJPEG refused while the batch was being queued: the batches
            // queued before it stay; what this one queued is waited for.
            Err(Error::Decode(_)) => self.gpu.synchronize(),
            Err(_) => {
                self.gpu.synchronize();
                self.batch.abandon();
            }
        }
        result
    }

    /// Stage -> upload -> launch -> download of one checked batch on the next ring
    /// entry (refused when it is still in flight); the tensors go to `target` (the
    /// caller's pinned memory, alive and untouched until the batch completes) when
    /// given, else to the entry's output.
    pub(crate) fn batch_submit(
        &mut self,
        slots: &[BatchSlot<'_, '_>],
        conv: Option<&Conv2dOp>,
        target: Option<Target>,
    ) -> Result<()> {
        let r = self.batch.next;
        if self.batch.ring[r].in_flight.is_some() {
            return Err(Error::misuse(
                "submit_batch",
                format!("{BATCH_RING} batches already in flight: finish_batch one first"),
            ));
        }
        self.batch.next = (r + 1) % BATCH_RING;
        if let Some(c) = conv {
            self.ensure_conv_constants(c)?;
        }
        let up = self.gpu.upload_stream(!self.batch.queue.is_empty());
        let (n, p0) = (slots.len(), slots[0].op.params);
        let (desc, item_len) = (p0.tensor_desc(), p0.tensor_desc().byte_len());
        let len = item_len * n;

        // Stage: the tables, then every frame at once.
        let stage_in = nvtx::stage(Stage::StageIn);
        let b = &mut self.batch;
        b.tables.resize_with(n.max(b.tables.len()), Tables::default);
        let maps: Vec<CUdeviceptr> = (slots.iter().zip(&mut b.tables))
            .map(|(s, t)| s.image.map_or(Ok(0), |_| t.ensure(&self.gpu.stream, s.op).map(|t| t.0)))
            .collect::<Result<_, _>>()?;
        let t = Instant::now();
        let (gpu, e, jpeg) = (&mut self.gpu, &mut self.batch.ring[r], &mut self.jpeg);
        e.inputs.resize_with(n.max(e.inputs.len()), Default::default);
        let frames: Vec<Option<Source<'_>>> =
            slots.iter().map(|s| s.image.map(Source::of).transpose()).collect::<Result<_>>()?;
        // SAFETY: the entry is free: its previous batch completed (finished, or abandoned
        // after waiting for both streams); `target` is the caller's promise.
        let dst = unsafe {
            gpu.stage(&mut e.inputs, &frames)?;
            gpu.destination(&mut e.output, target, len)?
        };
        let host_us = t.elapsed().as_secs_f32() * 1e6;
        drop(stage_in);
        // With conv2d the fused kernel writes float32 NCHW scratch for the valid slots
        // and the padded slots' final values straight into the tensor.
        let scratch = conv.map(|_| gpu.conv_input(desc.len() * n)).transpose()?;

        // Decode: every JPEG slot in one nvJPEG call. Then upload: the frames, then the
        // slot table that points at them.
        let upload = nvtx::stage(Stage::Upload);
        let jpegs: Vec<(usize, &Compressed<'_>)> = (frames.iter().enumerate())
            .filter_map(|(i, f)| match f {
                Some(Source::Jpeg(c)) => Some((i, *c)),
                _ => None,
            })
            .collect();
        let mut decoded: Vec<Option<CUdeviceptr>> = vec![None; n];
        if !jpegs.is_empty() {
            // SAFETY: as above; the entry is not reused before its last event.
            let dsts = unsafe { decode_jpegs(jpeg.gpu()?, e, &up, &jpegs) }?;
            for (&(i, _), d) in jpegs.iter().zip(dsts) {
                decoded[i] = Some(d);
            }
        }
        e.begin_upload(&up)?;
        let mut rows = Vec::with_capacity(n);
        let mut skip = 0u32;
        for (i, (slot, maps)) in slots.iter().zip(maps).enumerate() {
            let mut row = BatchItemDesc { p: slot.op.params, reserved: 0, src: 0, maps, dst: 0 };
            row.dst = dst.tensor + (i * item_len) as u64;
            match (frames[i], scratch) {
                // Padded: empty content rectangle (every pixel pad[c]), nothing read.
                (None, _) => {
                    (row.p.content_w, row.p.content_h) = (0, 0);
                    row.p.encoding = Encoding::ALL[0] as u32;
                    skip |= 1 << i;
                }
                (Some(source), scratch) => {
                    let what = format!("the frame of slot {i}");
                    row.src = match decoded[i] {
                        Some(d) => d,
                        // SAFETY: as above; the entry is not reused before its last event.
                        None => unsafe { e.inputs[i].upload(source.staged_len(), &up, &what)? },
                    };
                    if let Some(s) = scratch {
                        (row.p.layout, row.p.dtype) = (Layout::Nchw, DType::Float32);
                        row.dst = s + (i * desc.len() * 4) as u64;
                    }
                }
            }
            rows.push(row);
        }
        let bytes = BatchItemDesc::as_bytes(&rows);
        // SAFETY: as above.
        let table = unsafe {
            gpu.stage(std::slice::from_mut(&mut e.table), &[Some(Source::Pixels(bytes, None))])?;
            e.table.upload(bytes.len(), &up, "the batch table")?
        };
        e.end_upload(&up, &gpu.stream)?;
        drop(upload);

        // Launch -> download.
        let f = &self.kernels.resize_batch;
        let resident = *self
            .batch
            .resident
            .get_or_insert_with(|| resident_blocks(f, 0, self.device.multiprocessors));
        let tiles = launch::resize_normalize_tiles(&p0);
        let cfg = launch::resize_normalize_batch_cfg(tiles, n as u32, resident);
        let conv = conv.zip(scratch).map(|(c, s)| self.conv_step(&p0, c, n as u32, skip, s));
        let fused = || launch_kernel!(self.gpu.stream, f, RESIZE_NORMALIZE_BATCH, cfg, &table);
        self.launch_and_download(&self.batch.ring[r], fused, conv, dst, len)?;
        let direct = target.is_some_and(|t| t.direct());
        let decoded = !jpegs.is_empty();
        self.batch.ring[r].in_flight =
            Some(InFlight { len, host_us, direct, encoding: None, decoded });
        self.batch.queue.push_back(r);
        Ok(())
    }

    /// Finish the oldest queued batch ([`Entry::finish`]); returns its stage times, its
    /// ring entry and the bytes of its tensors in the entry's output (0 when they went to
    /// the caller's memory).
    pub(crate) fn batch_finish(
        &mut self,
        out: Option<&mut [u8]>,
    ) -> Result<(StageTimes, usize, usize)> {
        let Some(&r) = self.batch.queue.front() else {
            return Err(Error::misuse("finish_batch", "no batch in flight: submit_batch first"));
        };
        let (times, f) = self.batch.ring[r].finish(out)?;
        self.batch.queue.pop_front();
        Ok((times, r, if f.direct { 0 } else { f.len }))
    }
}
