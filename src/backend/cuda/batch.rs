//! The batch on the GPU ([`Backend::process_batch_into`](crate::backend::Backend)): the N
//! frames staged into their pinned buffers and uploaded, ONE launch of
//! `resize_normalize_batch` for every slot (grid z = slot; each slot's operation, frame,
//! tables and output in one small device table of [`BatchItemDesc`], so the cameras may
//! differ in size and encoding), one conv2d launch over the batch (grid z = slot, padded
//! slots skipped), one download of the N tensors. A padded slot (stale camera) gets an
//! empty content rectangle: the kernel writes pad[c] everywhere and reads nothing.

use super::{drv_err, map_words, stage_copy, CudaBackend, Target};
use crate::backend::{AxisMap, BatchSlot, Conv2dOp, PreprocessParams, StageTimes};
use crate::config::{DType, Layout, MemoryMode};
use crate::error::{CudaError, Result};
use crate::image::Encoding;
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaEvent, DeviceRepr};
use std::time::Instant;

use super::kernels::RESIZE_NORMALIZE_BATCH;
use super::launch;
use super::memory::{DeviceBuffer, PinnedBuffer, PinnedKind, SRC_SLACK};
use crate::launch_kernel;

/// One slot of a batched fused launch, one row of the device table.
/// Keep in sync with `struct BatchItemDesc` in `kernels/common.cuh` (checked at every
/// compilation: kernels.rs `layout_defines`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BatchItemDesc {
    /// The slot's operation (a padded slot: empty content rectangle).
    pub p: PreprocessParams,
    /// 0 (aligns the addresses to 8 bytes).
    pub reserved: u32,
    /// Device address of the frame (0 for a padded slot).
    pub src: u64,
    /// Device address of its sampling tables (0 for a padded slot).
    pub maps: u64,
    /// Device address of this slot's output.
    pub dst: u64,
}

// SAFETY: #[repr(C)] of 4-byte fields, one u32 and three u64 (no implicit padding: 100 +
// 4 bytes before the first u64), with the C twin's size and offsets checked by
// static_assert at every compilation.
unsafe impl DeviceRepr for BatchItemDesc {}

/// Buffers of the batched path, one set per slot, reused from batch to batch.
#[derive(Default)]
pub struct BatchState {
    inputs: Vec<Option<PinnedBuffer>>,
    src: Vec<DeviceBuffer>,
    maps: Vec<DeviceBuffer>,
    maps_for: Vec<Option<(AxisMap, AxisMap, u32, u32)>>,
    table_host: Option<PinnedBuffer>,
    table_dev: DeviceBuffer,
    out_host: Option<PinnedBuffer>,
    /// start, after upload, after preprocess, after conv, after download.
    events: Vec<CudaEvent>,
    resident: Option<u32>,
}

impl CudaBackend {
    /// The batch (see the module comment), into `out` (exactly `slots.len()` tensors).
    pub(super) fn batch_into(
        &mut self,
        slots: &[BatchSlot<'_, '_>],
        conv: Option<&Conv2dOp>,
        out: &mut [u8],
    ) -> Result<StageTimes> {
        let item_len = crate::backend::check_batch(slots, out)?;
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let n = slots.len();
        if n > 32 {
            return Err(drv_err("batch", format!("{n} slots; at most 32 per launch")).into());
        }
        let target = self.direct_target(out);
        let result = self.batch_queue(slots, conv, item_len, target);
        let result = result.and_then(|(host_us, direct)| self.batch_finish(out, direct, host_us));
        if result.is_err() {
            // Work queued before the error may still write `out`: wait for the stream
            // before `out` is released (its own error, if any, is the same failure).
            let _ = self.stream.synchronize();
        }
        result
    }

    /// Stage, upload and queue everything; returns the host staging time and whether
    /// the tensors go straight to `out` (pinned memory of this context).
    fn batch_queue(
        &mut self,
        slots: &[BatchSlot<'_, '_>],
        conv: Option<&Conv2dOp>,
        item_len: usize,
        target: Option<Target>,
    ) -> Result<(f32, bool)> {
        let n = slots.len();
        let mapped = self.mode == MemoryMode::Mapped;
        let b = &mut self.batch;
        if b.events.len() < 5 {
            b.events.clear();
            for _ in 0..5 {
                b.events.push(
                    self.ctx
                        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                        .map_err(|e| drv_err("cuEventCreate(timing)", e))?,
                );
            }
        }
        b.inputs.resize_with(n.max(b.inputs.len()), || None);
        b.src.resize_with(n.max(b.src.len()), DeviceBuffer::default);
        b.maps.resize_with(n.max(b.maps.len()), DeviceBuffer::default);
        b.maps_for.resize_with(n.max(b.maps_for.len()), || None);
        let stream = self.stream.clone();
        let cu_stream = stream.cu_stream();
        let ev = |b: &BatchState, i: usize| {
            b.events[i].record(&stream).map_err(|e| drv_err("cuEventRecord", e))
        };

        // The previous batch has completed (batch_finish waited), so every buffer is free.
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
            if !b.inputs[i].as_ref().is_some_and(|buf| buf.len() >= data.len() + SRC_SLACK) {
                b.inputs[i] = None;
                b.inputs[i] = Some(PinnedBuffer::new(&self.ctx, data.len() + SRC_SLACK, kind)?);
            }
            let key_ok = matches!(&b.maps_for[i], Some((x, y, w, h))
                if *x == slot.op.x_map && *y == slot.op.y_map
                    && *w == image.width() && *h == image.height());
            let maps = match b.maps[i].ptr(&stream) {
                Some(d) if key_ok => d,
                _ => {
                    let words = map_words(slot.op, image)?;
                    let d = b.maps[i].ensure(&stream, words.len(), "sampling tables")?;
                    // SAFETY: d has at least words.len() bytes; the source is pageable, so
                    // the call returns once the bytes are staged and `words` may go.
                    unsafe {
                        sys::cuMemcpyHtoDAsync_v2(d, words.as_ptr().cast(), words.len(), cu_stream)
                    }
                    .result()
                    .map_err(|e| drv_err("uploading the sampling tables", e))?;
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
        for (input, slot) in b.inputs.iter_mut().zip(slots) {
            let (Some(input), Some(image)) = (input.as_mut(), slot.image) else { continue };
            let data = image.data();
            // SAFETY: the previous batch completed before this one started (batch_finish
            // waits for its last event, also on errors), so no GPU work uses this buffer;
            // each slot has its own buffer, so the slices do not overlap.
            copies.push((unsafe { &mut input.host_mut()[..data.len()] }, data));
        }
        {
            use rayon::prelude::*;
            copies.into_par_iter().with_max_len(1).for_each(|(d, s)| stage_copy(d, s));
        }
        let host_us = t.elapsed().as_secs_f32() * 1e6;

        ev(b, 0)?;
        // Uploads (mapped: the kernel reads the pinned frames where the CPU wrote them).
        for (i, slot) in slots.iter().enumerate() {
            let Some(image) = slot.image else { continue };
            let len = image.data().len();
            let Some(input) = b.inputs[i].as_ref() else {
                return Err(drv_err("staging", "batch input buffer missing").into());
            };
            rows[i].src = match input.device_ptr() {
                Some(d) => d,
                None => {
                    let d = b.src[i].ensure(&stream, len + SRC_SLACK, "the frame")?;
                    // SAFETY: the pinned source holds len staged bytes and stays alive and
                    // untouched until the batch's last event completes; d has len bytes.
                    unsafe {
                        sys::cuMemcpyHtoDAsync_v2(d, input.host_ptr().cast(), len, cu_stream)
                    }
                    .result()
                    .map_err(|e| drv_err(format!("uploading {len} frame bytes of slot {i}"), e))?;
                    d
                }
            };
        }

        // Outputs: the caller's mapped memory, else the device tensor; with conv the
        // fused kernel writes float32 NCHW scratch for the valid slots and the padded
        // slots' final values straight into the tensor.
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
        let table_len = n * std::mem::size_of::<BatchItemDesc>();
        if !b.table_host.as_ref().is_some_and(|t| t.len() >= table_len) {
            b.table_host = None;
            b.table_host = Some(PinnedBuffer::new(&self.ctx, table_len, PinnedKind::Upload)?);
        }
        let Some(table_host) = b.table_host.as_mut() else {
            return Err(drv_err("staging", "batch table buffer missing").into());
        };
        // SAFETY: BatchItemDesc is plain #[repr(C)] data without padding (see its
        // DeviceRepr note), so its bytes may be viewed as u8; the table buffer is free
        // (the previous batch completed).
        unsafe {
            let bytes = std::slice::from_raw_parts(rows.as_ptr().cast::<u8>(), table_len);
            table_host.host_mut()[..table_len].copy_from_slice(bytes);
        }
        let table = b.table_dev.ensure(&stream, table_len, "the batch table")?;
        // SAFETY: pinned source of table_len bytes, alive and untouched until the batch
        // completes; table has table_len bytes.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(table, table_host.host_ptr().cast(), table_len, cu_stream)
        }
        .result()
        .map_err(|e| drv_err("uploading the batch table", e))?;
        ev(b, 1)?;

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
        ev(b, 2)?;
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
        let b = &mut self.batch;
        ev(b, 3)?;
        let direct = target.is_some();
        if target.and_then(|t| t.device).is_none() {
            let host = match target {
                Some(t) => t.host,
                None => {
                    if !b.out_host.as_ref().is_some_and(|o| o.len() >= total) {
                        b.out_host = None;
                        b.out_host =
                            Some(PinnedBuffer::new(&self.ctx, total, PinnedKind::Download)?);
                    }
                    match b.out_host.as_ref() {
                        Some(o) => o.host_ptr(),
                        None => return Err(drv_err("staging", "batch output missing").into()),
                    }
                }
            };
            // SAFETY: host (the caller's pinned `out` or the batch's pinned output) has
            // `total` bytes and is not read before the batch's last event completes.
            unsafe { sys::cuMemcpyDtoHAsync_v2(host.cast(), tensor, total, cu_stream) }
                .result()
                .map_err(|e| drv_err(format!("downloading {total} batch tensor bytes"), e))?;
        }
        ev(b, 4)?;
        Ok((host_us, direct))
    }

    /// Wait for the batch; copy the tensors into `out` unless they went there directly.
    fn batch_finish(&mut self, out: &mut [u8], direct: bool, host_us: f32) -> Result<StageTimes> {
        let b = &self.batch;
        b.events[4].synchronize().map_err(|e| {
            drv_err(
                format!("running the batch (upload, {RESIZE_NORMALIZE_BATCH}, conv, download)"),
                e,
            )
        })?;
        let ms = |a: usize, c: usize| -> Result<f32, CudaError> {
            b.events[a].elapsed_ms(&b.events[c]).map_err(|e| drv_err("cuEventElapsedTime", e))
        };
        let (up, pre, conv, down) = (ms(0, 1)?, ms(1, 2)?, ms(2, 3)?, ms(3, 4)?);
        let t = Instant::now();
        if !direct {
            let Some(o) = b.out_host.as_ref() else {
                return Err(drv_err("finish", "batch output missing").into());
            };
            // SAFETY: the batch's last event has completed: nothing writes this buffer.
            out.copy_from_slice(unsafe { &o.host()[..out.len()] });
        }
        Ok(StageTimes {
            upload_us: host_us + up * 1e3,
            preprocess_us: pre * 1e3,
            conv_us: conv * 1e3,
            download_us: down * 1e3 + t.elapsed().as_secs_f32() * 1e6,
        })
    }
}
