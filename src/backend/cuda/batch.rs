//! The batch on the GPU ([`Backend::process_batch_into`](crate::backend::Backend)): the N
//! frames staged into their pinned buffers and uploaded, ONE launch of
//! `resize_normalize_batch` for every slot (grid z = slot; each slot's operation, frame,
//! tables and output in one small device table of [`BatchItemDesc`], so the cameras may
//! differ in size and encoding), one conv2d launch over the batch (grid z = slot, padded
//! slots skipped), one download of the N tensors. A padded slot (stale camera) gets an
//! empty content rectangle: the kernel writes pad[c] everywhere and reads nothing.
//!
//! Two batches can be in flight ([`BATCH_RING`] sets of buffers): the frames' staging
//! (host) and upload (copy stream) of batch k+1 run while batch k's kernels and download
//! run on the compute stream, which waits for each batch's upload event.
//! [`CudaBackend::submit_batch`] / [`CudaBackend::finish_batch`] are that pipelined
//! form; [`Backend::process_batch_into`](crate::backend::Backend) is one submit and its
//! finish (the tensors straight into `out` when it is pinned memory of this context).

use super::{drv_err, map_words, stage_copy, CudaBackend, Target, EVENTS};
use crate::backend::{AxisMap, BatchSlot, Conv2dOp, StageTimes};
use crate::config::{DType, Layout, MemoryMode};
use crate::error::{CudaError, Error, Result};
use crate::image::Encoding;
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaEvent, CudaStream};
use std::collections::VecDeque;
use std::time::Instant;

use super::kernels::RESIZE_NORMALIZE_BATCH;
use super::launch::{self, BatchItemDesc, MAX_BATCH_SLOTS};
use super::memory::{DeviceBuffer, PinnedBuffer, PinnedKind, SRC_SLACK};
use crate::launch_kernel;

/// Batches in flight at once through [`CudaBackend::submit_batch`].
pub const BATCH_RING: usize = 2;

/// Buffers of the batched path, reused from batch to batch.
#[derive(Default)]
pub struct BatchState {
    /// Per slot: its sampling tables (uploaded on the compute stream, so in stream order
    /// with the kernels of both ring entries) and what they were built for.
    maps: Vec<DeviceBuffer>,
    maps_for: Vec<Option<(AxisMap, AxisMap, u32, u32)>>,
    /// [`BATCH_RING`] sets of per-batch buffers.
    ring: Vec<BatchEntry>,
    /// Ring entries submitted and not yet finished, oldest first.
    queue: VecDeque<usize>,
    next: usize,
    resident: Option<u32>,
}

/// The buffers of one batch in flight.
struct BatchEntry {
    /// Per slot: the pinned frame and the device frame.
    inputs: Vec<Option<PinnedBuffer>>,
    src: Vec<DeviceBuffer>,
    table_host: Option<PinnedBuffer>,
    table_dev: DeviceBuffer,
    out_host: Option<PinnedBuffer>,
    /// See [`EVENTS`].
    events: Vec<CudaEvent>,
    in_flight: Option<BatchInFlight>,
}

struct BatchInFlight {
    /// Bytes of the N tensors.
    total: usize,
    host_us: f32,
    /// The tensors went straight to the caller's pinned memory, not to `out_host`.
    direct: bool,
}

impl CudaBackend {
    /// The batch (see the module comment), into `out` (exactly `slots.len()` tensors).
    pub(super) fn batch_into(
        &mut self,
        slots: &[BatchSlot<'_, '_>],
        conv: Option<&Conv2dOp>,
        out: &mut [u8],
    ) -> Result<StageTimes> {
        crate::backend::check_batch(slots, out)?;
        if !self.batch.queue.is_empty() {
            return Err(drv_err(
                "process_batch_into",
                "batches submitted with submit_batch are not finished",
            )
            .into());
        }
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let target = self.direct_target(out);
        let result = self.batch_submit(slots, conv, target);
        let result = result.and_then(|()| self.batch_finish(Some(out)).map(|(times, _, _)| times));
        if result.is_err() {
            self.batch_abandon();
        }
        result
    }

    /// Queue a batch (the pipelined form of [`Backend::process_batch_into`]): the frames
    /// are staged into this batch's pinned buffers before it returns (the images may go),
    /// the upload runs on the copy stream, the kernels and the download on the compute
    /// stream. At most [`BATCH_RING`] batches may be queued; [`CudaBackend::finish_batch`]
    /// returns them in order. Submitting batch k+1 before finishing batch k is what
    /// overlaps k+1's staging and upload with k's kernels and download. On an error
    /// every queued batch is abandoned (both streams waited for).
    ///
    /// [`Backend::process_batch_into`]: crate::backend::Backend::process_batch_into
    pub fn submit_batch(
        &mut self,
        slots: &[BatchSlot<'_, '_>],
        conv: Option<&Conv2dOp>,
    ) -> Result<()> {
        crate::backend::check_batch_shape(slots)?;
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let result = self.batch_submit(slots, conv, None);
        if result.is_err() {
            self.batch_abandon();
        }
        result
    }

    /// Wait for the oldest batch queued by [`CudaBackend::submit_batch`] and copy its N
    /// tensors into `out` (exactly their length); its stage times (upload: host staging
    /// and the copy stream's upload; preprocess, conv, download: the compute stream's
    /// events, from when it started the batch).
    pub fn finish_batch(&mut self, out: &mut [u8]) -> Result<StageTimes> {
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let result = self.batch_finish(Some(out)).map(|(times, _, _)| times);
        if result.is_err() {
            self.batch_abandon();
        }
        result
    }

    /// [`CudaBackend::finish_batch`] without the copy: the N tensors where the download
    /// left them (this batch's pinned output), valid until the next `submit_batch`.
    pub fn finish_batch_view(&mut self) -> Result<(StageTimes, &[u8])> {
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let (times, r, total) = match self.batch_finish(None) {
            Ok(done) => done,
            Err(e) => {
                self.batch_abandon();
                return Err(e);
            }
        };
        match self.batch.ring.get(r).and_then(|e| e.out_host.as_ref()) {
            // SAFETY: the batch's last event has completed, and the next write to this
            // buffer is queued by a later submit_batch, which needs `&mut self`, so not
            // while the returned borrow lives.
            Some(o) => Ok((times, unsafe { &o.host()[..total] })),
            None => Err(drv_err("finish_batch_view", "batch output missing").into()),
        }
    }

    /// Batches queued by [`CudaBackend::submit_batch`] and not yet finished.
    pub fn batches_in_flight(&self) -> usize {
        self.batch.queue.len()
    }

    /// After an error: wait for both streams (queued work may still use the buffers or
    /// the caller's `out`) and forget every queued batch.
    fn batch_abandon(&mut self) {
        self.synchronize_streams();
        for r in self.batch.queue.drain(..) {
            if let Some(e) = self.batch.ring.get_mut(r) {
                e.in_flight = None;
            }
        }
    }

    /// The next free ring entry (creating the ring on first use).
    fn batch_entry(&mut self) -> Result<usize> {
        let b = &mut self.batch;
        if b.ring.is_empty() {
            for _ in 0..BATCH_RING {
                let mut events = Vec::with_capacity(EVENTS);
                for _ in 0..EVENTS {
                    events.push(
                        self.ctx
                            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                            .map_err(|e| drv_err("cuEventCreate(timing)", e))?,
                    );
                }
                b.ring.push(BatchEntry {
                    inputs: Vec::new(),
                    src: Vec::new(),
                    table_host: None,
                    table_dev: DeviceBuffer::default(),
                    out_host: None,
                    events,
                    in_flight: None,
                });
            }
        }
        let r = b.next;
        if b.ring[r].in_flight.is_some() {
            return Err(drv_err(
                "submit_batch",
                format!("{BATCH_RING} batches already in flight: finish_batch one first"),
            )
            .into());
        }
        b.next = (r + 1) % BATCH_RING;
        Ok(r)
    }

    /// Stage, upload and queue everything for one batch on ring entry `r`; the tensors go
    /// to `target` (the caller's pinned memory) when given, else to the entry's pinned
    /// output.
    fn batch_submit(
        &mut self,
        slots: &[BatchSlot<'_, '_>],
        conv: Option<&Conv2dOp>,
        target: Option<Target>,
    ) -> Result<()> {
        let n = slots.len();
        if n > MAX_BATCH_SLOTS {
            return Err(Error::Operation(format!(
                "a batch of {n} slots; the CUDA backend runs at most {MAX_BATCH_SLOTS} in one \
                 launch (launch::MAX_BATCH_SLOTS): split the batch"
            )));
        }
        let item_len = slots[0].op.params.tensor_desc().byte_len();
        let r = self.batch_entry()?;
        let mapped = self.mode == MemoryMode::Mapped;
        let stream = self.stream.clone();
        // The uploads go on the copy stream when another batch is in flight (they then
        // overlap its kernels and download); alone, on the compute stream itself: a
        // cross-stream wait would only add the kernel's launch latency (~5 us on the
        // H200) with nothing to overlap.
        let overlap = !self.batch.queue.is_empty();
        let up = if overlap { self.copy.clone() } else { stream.clone() };
        let cu_stream = stream.cu_stream();
        let b = &mut self.batch;
        b.maps.resize_with(n.max(b.maps.len()), DeviceBuffer::default);
        b.maps_for.resize_with(n.max(b.maps_for.len()), || None);
        let e = &mut b.ring[r];
        e.inputs.resize_with(n.max(e.inputs.len()), || None);
        e.src.resize_with(n.max(e.src.len()), DeviceBuffer::default);
        let ev = |e: &BatchEntry, i: usize, on: &CudaStream| {
            e.events[i].record(on).map_err(|err| drv_err("cuEventRecord", err))
        };

        // This entry's previous batch has completed (finished, or abandoned after waiting
        // for both streams), so every buffer of the entry is free.
        let t = Instant::now();
        let desc = slots[0].op.params.tensor_desc();
        let mut rows = Vec::with_capacity(n);
        let mut skip = 0u32;
        for (i, slot) in slots.iter().enumerate() {
            let mut p = slot.op.params;
            let Some(image) = slot.image else {
                // Padded: empty content rectangle (every pixel pad[c]), nothing read.
                p.content_w = 0;
                p.content_h = 0;
                p.encoding = Encoding::ALL[0] as u32;
                skip |= 1 << i;
                rows.push(BatchItemDesc { p, reserved: 0, src: 0, maps: 0, dst: 0 });
                continue;
            };
            if p.src_width != image.width()
                || p.src_height != image.height()
                || p.encoding != image.encoding() as u32
            {
                return Err(drv_err(
                    "checking the batch",
                    format!("slot {i}: operation built for another frame size or encoding"),
                )
                .into());
            }
            let data = image.data();
            let kind = if mapped { PinnedKind::Mapped } else { PinnedKind::Upload };
            if !e.inputs[i].as_ref().is_some_and(|buf| buf.len() >= data.len() + SRC_SLACK) {
                e.inputs[i] = None;
                e.inputs[i] = Some(PinnedBuffer::new(&self.ctx, data.len() + SRC_SLACK, kind)?);
            }
            let key_ok = matches!(&b.maps_for[i], Some((x, y, w, h))
                if *x == slot.op.x_map && *y == slot.op.y_map
                    && *w == image.width() && *h == image.height());
            let maps = match b.maps[i].ptr(&stream) {
                Some(d) if key_ok => d,
                _ => {
                    let words = map_words(slot.op, image)?;
                    // On the compute stream: after the kernels already queued that read
                    // the old tables (either ring entry), before this batch's kernel.
                    let d = b.maps[i].ensure(&stream, words.len(), "sampling tables")?;
                    // SAFETY: d has at least words.len() bytes; the source is pageable, so
                    // the call returns once the bytes are staged and `words` may go.
                    unsafe {
                        sys::cuMemcpyHtoDAsync_v2(d, words.as_ptr().cast(), words.len(), cu_stream)
                    }
                    .result()
                    .map_err(|err| drv_err("uploading the sampling tables", err))?;
                    b.maps_for[i] = Some((
                        slot.op.x_map.clone(),
                        slot.op.y_map.clone(),
                        image.width(),
                        image.height(),
                    ));
                    d
                }
            };
            rows.push(BatchItemDesc { p, reserved: 0, src: 0, maps, dst: 0 });
        }
        // The frames into their pinned buffers, all slots at once (each copy in pieces
        // too): one frame after the other would leave most of the host's memory
        // bandwidth unused, as N single-camera processes would not.
        let mut copies: Vec<(&mut [u8], &[u8])> = Vec::with_capacity(n);
        for (input, slot) in e.inputs.iter_mut().zip(slots) {
            let (Some(input), Some(image)) = (input.as_mut(), slot.image) else { continue };
            let data = image.data();
            // SAFETY: this ring entry's previous batch completed (see above), so no GPU
            // work uses this buffer; each slot has its own buffer, so the slices do not
            // overlap.
            copies.push((unsafe { &mut input.host_mut()[..data.len()] }, data));
        }
        {
            use rayon::prelude::*;
            copies.into_par_iter().with_max_len(1).for_each(|(d, s)| stage_copy(d, s));
        }
        let host_us = t.elapsed().as_secs_f32() * 1e6;

        // Uploads on `up` (mapped: the kernel reads the pinned frames where the CPU wrote
        // them).
        ev(e, 0, &up)?;
        for (i, slot) in slots.iter().enumerate() {
            let Some(image) = slot.image else { continue };
            let len = image.data().len();
            let Some(input) = e.inputs[i].as_ref() else {
                return Err(drv_err("staging", "batch input buffer missing").into());
            };
            rows[i].src = match input.device_ptr() {
                Some(d) => d,
                None => {
                    let d = e.src[i].ensure(&up, len + SRC_SLACK, "the frame")?;
                    // SAFETY: the pinned source holds len staged bytes and stays alive and
                    // untouched until the batch's last event completes; d (this entry's,
                    // free) has len bytes.
                    unsafe {
                        sys::cuMemcpyHtoDAsync_v2(d, input.host_ptr().cast(), len, up.cu_stream())
                    }
                    .result()
                    .map_err(|err| {
                        drv_err(format!("uploading {len} frame bytes of slot {i}"), err)
                    })?;
                    d
                }
            };
        }

        // Outputs: the caller's mapped memory, else the device tensor; with conv the
        // fused kernel writes float32 NCHW scratch for the valid slots and the padded
        // slots' final values straight into the tensor. Both are shared by the ring
        // entries and used only on the compute stream, in batch order.
        let total = item_len * n;
        let tensor: CUdeviceptr = match target.and_then(|t| t.device) {
            Some(d) => d,
            None => self.out_dev.ensure(&stream, total, "the batch tensor")?,
        };
        let scratch = match conv {
            Some(c) => {
                c.check()?;
                Some(self.scratch.ensure(&stream, desc.len() * 4 * n, "the conv2d input")?)
            }
            None => None,
        };
        #[cfg(feature = "fault-injection")]
        if self.poison {
            // As the single-frame path: poisoned outputs, so a slot the kernels skip shows.
            if let Some(s) = scratch {
                super::fault::memset(s, desc.len() * 4 * n, cu_stream)?;
            }
            if target.and_then(|t| t.device).is_none() {
                super::fault::memset(tensor, total, cu_stream)?;
            }
        }
        for (i, row) in rows.iter_mut().enumerate() {
            let padded = skip & (1 << i) != 0;
            match scratch {
                Some(s) if !padded => {
                    row.p.layout = Layout::Nchw;
                    row.p.dtype = DType::Float32;
                    row.dst = s + (i * desc.len() * 4) as u64;
                }
                _ => row.dst = tensor + (i * item_len) as u64,
            }
        }
        let b = &mut self.batch;
        let e = &mut b.ring[r];
        let table_len = n * std::mem::size_of::<BatchItemDesc>();
        if !e.table_host.as_ref().is_some_and(|t| t.len() >= table_len) {
            e.table_host = None;
            e.table_host = Some(PinnedBuffer::new(&self.ctx, table_len, PinnedKind::Upload)?);
        }
        let Some(table_host) = e.table_host.as_mut() else {
            return Err(drv_err("staging", "batch table buffer missing").into());
        };
        // SAFETY: the table buffer is free (this entry's previous batch completed).
        unsafe {
            table_host.host_mut()[..table_len].copy_from_slice(BatchItemDesc::as_bytes(&rows))
        };
        let table = e.table_dev.ensure(&up, table_len, "the batch table")?;
        // SAFETY: pinned source of table_len bytes, alive and untouched until the batch
        // completes; table (this entry's, free) has table_len bytes.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                table,
                table_host.host_ptr().cast(),
                table_len,
                up.cu_stream(),
            )
        }
        .result()
        .map_err(|err| drv_err("uploading the batch table", err))?;
        ev(e, 1, &up)?;
        if overlap {
            stream.wait(&e.events[1]).map_err(|err| drv_err("cuStreamWaitEvent(upload)", err))?;
        }
        ev(e, 2, &stream)?;

        let f = &self.resize_batch;
        let resident = match b.resident {
            Some(r) => r,
            None => {
                let r = super::resident_blocks(f, 0, self.device.multiprocessors);
                b.resident = Some(r);
                r
            }
        };
        let tiles = launch::resize_normalize_tiles(&slots[0].op.params);
        launch_kernel!(
            stream,
            f,
            RESIZE_NORMALIZE_BATCH,
            launch::resize_normalize_batch_cfg(tiles, n as u32, resident),
            &table
        )?;
        ev(&self.batch.ring[r], 3, &stream)?;
        if let (Some(c), Some(s)) = (conv, scratch) {
            self.ensure_conv_constants(c)?;
            let (mut cp, f, name) = self.conv_launch(&slots[0].op.params, c);
            cp.skip = skip;
            let w = slots[0].op.params.dst_width;
            let h = slots[0].op.params.dst_height;
            launch_kernel!(
                stream,
                f,
                name,
                launch::conv_tiled_batch_cfg(w, h, n as u32),
                &cp,
                &s,
                &tensor
            )?;
        }
        let e = &mut self.batch.ring[r];
        ev(e, 4, &stream)?;
        let direct = target.is_some();
        if target.and_then(|t| t.device).is_none() {
            let host = match target {
                Some(t) => t.host,
                None => {
                    if !e.out_host.as_ref().is_some_and(|o| o.len() >= total) {
                        e.out_host = None;
                        e.out_host =
                            Some(PinnedBuffer::new(&self.ctx, total, PinnedKind::Download)?);
                    }
                    match e.out_host.as_ref() {
                        Some(o) => o.host_ptr(),
                        None => return Err(drv_err("staging", "batch output missing").into()),
                    }
                }
            };
            // SAFETY: host (the caller's pinned `out` or the entry's pinned output) has
            // `total` bytes and is not read before the batch's last event completes.
            unsafe { sys::cuMemcpyDtoHAsync_v2(host.cast(), tensor, total, cu_stream) }
                .result()
                .map_err(|err| drv_err(format!("downloading {total} batch tensor bytes"), err))?;
        }
        ev(e, EVENTS - 1, &stream)?;
        e.in_flight = Some(BatchInFlight { total, host_us, direct });
        self.batch.queue.push_back(r);
        Ok(())
    }

    /// Wait for the oldest queued batch; copy the tensors into `out` unless they went
    /// there directly (or `out` is `None`). Returns its stage times, its ring entry and
    /// the bytes of its tensors in the entry's pinned output (0 when they went to the
    /// caller's memory).
    fn batch_finish(&mut self, out: Option<&mut [u8]>) -> Result<(StageTimes, usize, usize)> {
        let b = &mut self.batch;
        let Some(&r) = b.queue.front() else {
            return Err(drv_err("finish_batch", "no batch in flight").into());
        };
        let e = &mut b.ring[r];
        e.events[EVENTS - 1].synchronize().map_err(|err| {
            drv_err(
                format!("running the batch (upload, {RESIZE_NORMALIZE_BATCH}, conv, download)"),
                err,
            )
        })?;
        b.queue.pop_front();
        let Some(f) = e.in_flight.take() else {
            return Err(drv_err("finish_batch", "ring entry without a batch").into());
        };
        let ms = |a: usize, c: usize| -> Result<f32, CudaError> {
            e.events[a].elapsed_ms(&e.events[c]).map_err(|err| drv_err("cuEventElapsedTime", err))
        };
        let (up, pre, conv, down) = (ms(0, 1)?, ms(2, 3)?, ms(3, 4)?, ms(4, 5)?);
        let t = Instant::now();
        match out {
            Some(_) if f.direct => {}
            Some(out) if out.len() == f.total => {
                let Some(o) = e.out_host.as_ref() else {
                    return Err(drv_err("finish", "batch output missing").into());
                };
                // SAFETY: the batch's last event has completed: nothing writes this buffer.
                stage_copy(out, unsafe { &o.host()[..f.total] });
            }
            Some(out) => {
                return Err(drv_err(
                    "finish_batch",
                    format!("out has {} bytes; the batch's tensors are {}", out.len(), f.total),
                )
                .into())
            }
            None => {}
        }
        let times = StageTimes {
            upload_us: f.host_us + up * 1e3,
            preprocess_us: pre * 1e3,
            conv_us: conv * 1e3,
            download_us: down * 1e3 + t.elapsed().as_secs_f32() * 1e6,
        };
        Ok((times, r, if f.direct { 0 } else { f.total }))
    }
}
