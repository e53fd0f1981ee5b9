//! One frame on the GPU ([`Backend::process_into`](crate::backend::Backend)): ONE launch
//! of the fused kernel of its encoding (`resize_normalize_<enc>`), one conv2d launch when
//! configured: what a frame launches in the steps of `steps.rs` (stage, decode, upload,
//! launch, download), which the batch (`batch.rs`) runs too.

use super::device::resident_blocks;
use super::entry::Tables;
use super::kernel_set::{BackendKernels, ConvStep};
use super::launch::{self, FusedPath};
use super::steps::{Launch, OnDevice, Source};
use crate::backend::{Conv2dOp, Frame, PreprocessOp};
use crate::config::{DType, Layout};
use crate::error::{Error, Result};
use crate::image::Encoding;
use crate::launch_kernel;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// What the frame path keeps from frame to frame (the batch's: `BatchState`).
pub(super) struct FrameState {
    /// The last frame's sampling tables on the device.
    pub tables: Tables,
    /// The fused kernel's launch for (encoding, the tables on the device): the staged
    /// path's row words and the resident blocks (its grid size cap).
    shape: Option<(Encoding, u32, u32)>,
    /// How the fused kernel reads packed encodings.
    fused_path: FusedPath,
    /// The device's multiprocessors (the resident blocks' count).
    multiprocessors: i32,
    /// Frames whose tensor went straight into the caller's pinned memory.
    pub direct_frames: u64,
}

impl FrameState {
    pub(super) fn new(fused_path: FusedPath, multiprocessors: i32) -> Self {
        FrameState {
            tables: Tables::default(),
            shape: None,
            fused_path,
            multiprocessors,
            direct_frames: 0,
        }
    }
}

/// The checks of a frame before anything is queued: caller errors, never device ones.
pub(super) fn check(
    image: Frame<'_, '_>,
    op: &PreprocessOp,
    conv: Option<&Conv2dOp>,
) -> Result<()> {
    op.check(image)?;
    Source::of(image)?;
    conv.map_or(Ok(()), Conv2dOp::check)
}

/// A frame's part of a submission ([`Launch`]): its tables, its fused kernel, conv2d.
pub(super) struct FrameLaunch<'k> {
    kernels: &'k BackendKernels,
    state: &'k mut FrameState,
    op: &'k PreprocessOp,
    enc: Encoding,
    conv: Option<&'k Conv2dOp>,
    /// The tables' device address and the launch's (row words, resident blocks), once
    /// the tables are on the device.
    maps: CUdeviceptr,
    shape: (u32, u32),
}

impl<'k> FrameLaunch<'k> {
    pub(super) fn new(
        kernels: &'k BackendKernels,
        state: &'k mut FrameState,
        op: &'k PreprocessOp,
        enc: Encoding,
        conv: Option<&'k Conv2dOp>,
    ) -> Self {
        FrameLaunch { kernels, state, op, enc, conv, maps: 0, shape: (0, 0) }
    }

    /// The fused kernel's staged-path row words (0: the direct path) and resident blocks
    /// for the frame, kept while the encoding and the tables stay (`changed`: new tables
    /// were uploaded).
    fn fused_shape(&mut self, changed: bool) -> (u32, u32) {
        let (s, op, enc) = (&mut *self.state, self.op, self.enc);
        match s.shape {
            Some((e, words, resident)) if e == enc && !changed => (words, resident),
            _ => {
                let words = match s.fused_path {
                    FusedPath::Staged => launch::staged_row_words(&op.params, &op.x_map, enc),
                    FusedPath::Direct => 0,
                };
                let f = &self.kernels.resize[enc as usize];
                let resident = resident_blocks(f, words, s.multiprocessors);
                s.shape = Some((enc, words, resident));
                (words, resident)
            }
        }
    }
}

impl Launch for FrameLaunch<'_> {
    fn tables(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let (maps, changed) = self.state.tables.ensure(stream, self.op)?;
        self.maps = maps;
        self.shape = self.fused_shape(changed);
        Ok(())
    }

    /// The fused kernel writes the tensor, or float32 NCHW scratch for conv2d.
    fn fused(&self, stream: &Arc<CudaStream>, on: &OnDevice) -> Result<()> {
        let p = self.op.params;
        let mut fp = p;
        if on.scratch.is_some() {
            fp.layout = Layout::Nchw;
            fp.dtype = DType::Float32;
        }
        let Some(src) = on.frames.first().copied().flatten() else {
            return Err(Error::misuse("launching a frame", "its frame is not on the device"));
        };
        let dst = on.scratch.unwrap_or(on.tensor);
        let (row_words, resident) = self.shape;
        let cfg = launch::resize_normalize_cfg(&p, row_words, resident);
        let (f, name) = self.kernels.fused(self.enc);
        let maps = self.maps;
        launch_kernel!(stream, f, name, cfg, &fp, &src, &maps, &dst, &row_words)?;
        Ok(())
    }

    fn conv(&self, on: &OnDevice) -> Option<ConvStep<'_>> {
        let p = &self.op.params;
        self.conv.zip(on.scratch).map(|(c, src)| self.kernels.conv_step(p, c, 1, 0, src))
    }
}
