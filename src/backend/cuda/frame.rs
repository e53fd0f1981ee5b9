//! One frame on the GPU ([`Backend::process_into`](crate::backend::Backend)): the frame
//! staged and uploaded, ONE launch of the fused kernel of its encoding
//! (`resize_normalize_<enc>`), one conv2d launch when configured, one download: the steps
//! of `steps.rs`, as the batch (`batch.rs`). Two frames can be in flight ([`RING`]
//! entries): [`CudaBackend::submit`] / [`CudaBackend::finish`], the pipelined form, stage
//! and upload frame k+1 (on the copy stream) while frame k's kernels and download run on
//! the compute stream, which waits for each frame's upload event.

use super::launch;
use super::steps::{decode_jpegs, Entry, InFlight, Source, Tables, Target};
use super::{resident_blocks, CudaBackend, FusedPath};
use crate::backend::{Conv2dOp, Frame, PreprocessOp, StageTimes};
use crate::config::{DType, Layout};
use crate::error::{CudaError, Error, Result};
use crate::image::{Encoding, ImageView};
use crate::launch_kernel;
use crate::nvtx::{self, Stage};
use cudarc::driver::CudaContext;
use std::sync::Arc;
use std::time::Instant;

/// Frames that can be in flight at once: the ring of pinned staging buffers lets the CPU
/// stage frame N+1 while the GPU still works on frame N.
pub(crate) const RING: usize = 2;

/// Buffers of the frame path, reused from frame to frame (the batch's: `BatchState`).
pub(super) struct FrameState {
    /// [`RING`] entries of one input each.
    pub ring: Vec<Entry>,
    next: usize,
    pub tables: Tables,
    /// The fused kernel's launch for (encoding, the tables on the device): the staged
    /// path's row words and the resident blocks (its grid size cap).
    shape: Option<(Encoding, u32, u32)>,
    /// Frames whose tensor went straight into the caller's pinned memory.
    pub direct_frames: u64,
}

impl FrameState {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Self, CudaError> {
        Ok(FrameState {
            ring: (0..RING).map(|_| Entry::new(ctx, 1)).collect::<Result<_, _>>()?,
            next: 0,
            tables: Tables::default(),
            shape: None,
            direct_frames: 0,
        })
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

impl CudaBackend {
    /// Stage `image` and queue its whole frame (upload, preprocess, conv, download);
    /// returns the ring entry to pass to [`CudaBackend::finish`]. Blocks only if that
    /// entry's previous frame is still running (more than `RING` in flight). A frame
    /// whose operation does not fit it is refused before anything is queued; after any
    /// other error both streams are waited for.
    pub fn submit(
        &mut self,
        image: &ImageView<'_>,
        op: &PreprocessOp,
        conv: Option<&Conv2dOp>,
    ) -> Result<usize> {
        check(image.into(), op, conv)?;
        self.gpu.bind()?;
        let result = self.frame_submit(image.into(), op, conv, None);
        if result.is_err() {
            self.gpu.synchronize();
        }
        result
    }

    /// Wait for the frame queued in `slot` by [`CudaBackend::submit`], copy its tensor into
    /// `out` and return its stage times (events; the upload and download times include
    /// the CPU copies into and out of the pinned buffers).
    pub fn finish(&mut self, slot: usize, out: &mut Vec<u8>) -> Result<StageTimes> {
        self.gpu.bind()?;
        let Some(e) = self.frame.ring.get_mut(slot) else {
            return Err(Error::misuse(
                "finish",
                format!("no ring slot {slot}: finish a slot that submit returned"),
            ));
        };
        out.resize(e.in_flight.as_ref().map_or(0, |f| f.len), 0);
        e.finish(Some(out)).map(|(times, _)| times)
    }

    /// Stage -> upload -> launch -> download of one checked frame on the next ring entry
    /// (after waiting for its previous frame); the tensor goes to `target` (the caller's
    /// pinned memory, alive and untouched until the entry completes) when given, else to
    /// the entry's output. Returns the entry.
    pub(crate) fn frame_submit(
        &mut self,
        image: Frame<'_, '_>,
        op: &PreprocessOp,
        conv: Option<&Conv2dOp>,
        target: Option<Target>,
    ) -> Result<usize> {
        let s = self.frame.next;
        self.frame.next = (s + 1) % RING;
        if self.frame.ring[s].in_flight.take().is_some() {
            self.frame.ring[s].wait("waiting for an abandoned frame")?;
        }
        if let Some(c) = conv {
            self.ensure_conv_constants(c)?;
        }
        let overlap = self.frame.ring.iter().any(|e| e.in_flight.is_some());
        let up = self.gpu.upload_stream(overlap);
        let (p, enc, source) = (op.params, image.encoding(), Source::of(image)?);
        let (desc, len) = (p.tensor_desc(), p.tensor_desc().byte_len());

        // Stage.
        let stage_in = nvtx::stage(Stage::StageIn);
        let (maps, changed) = self.frame.tables.ensure(&self.gpu.stream, op)?;
        let t = Instant::now();
        let (gpu, e, jpeg) = (&mut self.gpu, &mut self.frame.ring[s], &mut self.jpeg);
        // SAFETY: the entry's previous frame completed (waited for above or by finish;
        // after a failed one both streams were waited for), and no other frame uses its
        // buffers; `target` is the caller's promise.
        let dst = unsafe {
            gpu.stage(&mut e.inputs, &[Some(source)])?;
            gpu.destination(&mut e.output, target, len)?
        };
        let host_us = t.elapsed().as_secs_f32() * 1e6;
        drop(stage_in);

        // Decode (a JPEG) -> upload (pixels).
        let upload = nvtx::stage(Stage::Upload);
        let decoded = match source {
            // SAFETY: as above; the entry is not reused before its last event completes.
            Source::Jpeg(c) => Some(unsafe { decode_jpegs(jpeg.gpu()?, e, &up, &[(0, c)]) }?[0]),
            Source::Pixels(..) => None,
        };
        e.begin_upload(&up)?;
        let src = match decoded {
            Some(d) => d,
            // SAFETY: as above.
            None => unsafe { e.inputs[0].upload(source.staged_len(), &up, "the frame")? },
        };
        e.end_upload(&up, &gpu.stream)?;
        drop(upload);

        // Launch -> download: the fused kernel writes the tensor, or float32 NCHW
        // scratch for conv2d.
        let scratch = conv.map(|_| gpu.conv_input(desc.len())).transpose()?;
        let mut fp = p;
        if scratch.is_some() {
            fp.layout = Layout::Nchw;
            fp.dtype = DType::Float32;
        }
        let fused_dst = scratch.unwrap_or(dst.tensor);
        let (row_words, resident) = self.fused_shape(op, enc, changed);
        let cfg = launch::resize_normalize_cfg(&p, row_words, resident);
        let (f, name) = self.fused_kernel(enc);
        let conv = conv.zip(scratch).map(|(c, src)| self.conv_step(&p, c, 1, 0, src));
        let fused = || {
            launch_kernel!(self.gpu.stream, f, name, cfg, &fp, &src, &maps, &fused_dst, &row_words)
        };
        self.launch_and_download(&self.frame.ring[s], fused, conv, dst, len)?;
        let direct = target.is_some_and(|t| t.direct());
        let decoded = decoded.is_some();
        self.frame.ring[s].in_flight =
            Some(InFlight { len, host_us, direct, encoding: Some(enc), decoded });
        Ok(s)
    }

    /// The fused kernel's staged-path row words (0: the direct path) and resident blocks
    /// for `op` and `enc`, kept while the encoding and the tables stay (`changed`: new
    /// tables were uploaded).
    fn fused_shape(&mut self, op: &PreprocessOp, enc: Encoding, changed: bool) -> (u32, u32) {
        match self.frame.shape {
            Some((e, words, resident)) if e == enc && !changed => (words, resident),
            _ => {
                let words = match self.fused_path {
                    FusedPath::Staged => launch::staged_row_words(&op.params, &op.x_map, enc),
                    FusedPath::Direct => 0,
                };
                let f = &self.kernels.resize[enc as usize];
                let resident = resident_blocks(f, words, self.device.multiprocessors);
                self.frame.shape = Some((enc, words, resident));
                (words, resident)
            }
        }
    }
}
