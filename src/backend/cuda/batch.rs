//! The batch on the GPU ([`Backend::process_batch_into`](crate::backend::Backend)): ONE
//! launch of `resize_normalize_batch` for every slot (grid z = slot; each slot's
//! operation, frame, tables and output in one small device table of [`BatchItemDesc`],
//! so the cameras may differ in size and encoding), one conv2d launch over the batch
//! (grid z = slot, padded slots skipped): what a batch launches in the steps of
//! `steps.rs`, which the single frame (`frame.rs`) runs too. A padded slot (stale camera)
//! gets an empty content rectangle: the kernel writes pad[c] everywhere and reads
//! nothing.

use super::device::resident_blocks;
use super::entry::{Entry, Tables};
use super::kernel_set::{BackendKernels, ConvStep};
use super::kernels::RESIZE_NORMALIZE_BATCH;
use super::launch::{self, BatchItemDesc, MAX_BATCH_SLOTS};
use super::steps::{Gpu, Launch, OnDevice, Source};
use crate::backend::{BatchSlot, Conv2dOp};
use crate::config::{DType, Layout};
use crate::error::{Error, Result};
use crate::image::Encoding;
use crate::launch_kernel;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// What the batch path keeps from batch to batch (the frame's: `FrameState`).
#[derive(Default)]
pub(super) struct BatchState {
    /// Per slot: its sampling tables (on the compute stream, so in stream order with the
    /// kernels of every ring entry).
    tables: Vec<Tables>,
    resident: Option<u32>,
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

/// A batch's part of a submission ([`Launch`]): each slot's tables, the slot table, the
/// batch kernel, conv2d over the batch.
pub(super) struct BatchLaunch<'k> {
    kernels: &'k BackendKernels,
    state: &'k mut BatchState,
    multiprocessors: i32,
    slots: &'k [BatchSlot<'k, 'k>],
    conv: Option<&'k Conv2dOp>,
    /// Each slot's tables on the device (0: padded), then the slot table's address and
    /// the batch kernel's resident blocks.
    maps: Vec<CUdeviceptr>,
    table: CUdeviceptr,
    resident: u32,
}

impl<'k> BatchLaunch<'k> {
    pub(super) fn new(
        kernels: &'k BackendKernels,
        state: &'k mut BatchState,
        multiprocessors: i32,
        slots: &'k [BatchSlot<'k, 'k>],
        conv: Option<&'k Conv2dOp>,
    ) -> Self {
        BatchLaunch {
            kernels,
            state,
            multiprocessors,
            slots,
            conv,
            maps: Vec::new(),
            table: 0,
            resident: 0,
        }
    }

    /// Bit i: slot i is padded (conv2d leaves it alone).
    fn skip(on: &OnDevice) -> u32 {
        (on.frames.iter().enumerate()).fold(0, |m, (i, f)| m | (u32::from(f.is_none()) << i))
    }

    /// The slot table: each slot's operation, frame, tables and output (with conv2d, the
    /// float32 NCHW scratch for the valid slots; the padded slots' final values go
    /// straight into the tensor).
    fn rows(&self, on: &OnDevice) -> Vec<BatchItemDesc> {
        let p0 = self.slots[0].op.params;
        let (desc, item_len) = (p0.tensor_desc(), p0.tensor_desc().byte_len());
        let mut rows = Vec::with_capacity(self.slots.len());
        for (i, (slot, &maps)) in self.slots.iter().zip(&self.maps).enumerate() {
            let mut row = BatchItemDesc { p: slot.op.params, reserved: 0, src: 0, maps, dst: 0 };
            row.dst = on.tensor + (i * item_len) as u64;
            match (on.frames[i], on.scratch) {
                // Padded: empty content rectangle (every pixel pad[c]), nothing read.
                (None, _) => {
                    (row.p.content_w, row.p.content_h) = (0, 0);
                    row.p.encoding = Encoding::ALL[0] as u32;
                }
                (Some(src), scratch) => {
                    row.src = src;
                    if let Some(s) = scratch {
                        (row.p.layout, row.p.dtype) = (Layout::Nchw, DType::Float32);
                        row.dst = s + (i * desc.len() * 4) as u64;
                    }
                }
            }
            rows.push(row);
        }
        rows
    }
}

impl Launch for BatchLaunch<'_> {
    fn tables(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let tables = &mut self.state.tables;
        tables.resize_with(self.slots.len().max(tables.len()), Tables::default);
        self.maps = (self.slots.iter().zip(tables))
            .map(|(s, t)| s.image.map_or(Ok(0), |_| t.ensure(stream, s.op).map(|t| t.0)))
            .collect::<Result<_>>()?;
        let (f, mp) = (&self.kernels.resize_batch, self.multiprocessors);
        self.resident = *self.state.resident.get_or_insert_with(|| resident_blocks(f, 0, mp));
        Ok(())
    }

    unsafe fn upload(
        &mut self,
        gpu: &mut Gpu,
        e: &mut Entry,
        up: &Arc<CudaStream>,
        on: &OnDevice,
    ) -> Result<()> {
        let rows = self.rows(on);
        let bytes = BatchItemDesc::as_bytes(&rows);
        // SAFETY: the entry is free and stays so until this submission completes
        // (`submit_entry`'s contract).
        self.table = unsafe {
            gpu.stage(std::slice::from_mut(&mut e.table), &[Some(Source::Pixels(bytes, None))])?;
            e.table.upload(bytes.len(), up, "the batch table")?
        };
        Ok(())
    }

    fn fused(&self, stream: &Arc<CudaStream>, _: &OnDevice) -> Result<()> {
        let (f, resident) = (&self.kernels.resize_batch, self.resident);
        let tiles = launch::resize_normalize_tiles(&self.slots[0].op.params);
        let cfg = launch::resize_normalize_batch_cfg(tiles, self.slots.len() as u32, resident);
        launch_kernel!(stream, f, RESIZE_NORMALIZE_BATCH, cfg, &self.table)?;
        Ok(())
    }

    fn conv(&self, on: &OnDevice) -> Option<ConvStep<'_>> {
        let (p0, n) = (&self.slots[0].op.params, self.slots.len() as u32);
        let skip = Self::skip(on);
        self.conv.zip(on.scratch).map(|(c, s)| self.kernels.conv_step(p0, c, n, skip, s))
    }
}
