//! A ring entry: the buffers and timing events of one submission in flight (a frame, or
//! a batch of frames), what it needs on the device (its frames' staging, their sampling
//! tables), its decode step (nvJPEG) and its finish; and the ring of them every
//! submission takes its entry from (`steps.rs` runs the steps on it).

use super::driver::drv_err;
use super::kernels::{resize_normalize_entry, RESIZE_NORMALIZE_BATCH};
use super::memory::{DeviceBuffer, PinnedBuffer, SRC_SLACK};
use super::nvjpeg::{DecodeItem, NvJpeg};
use super::registry::InPlace;
use super::steps::{parallel_copy, Source};
use crate::backend::{AxisMap, PreprocessOp, StageTimes};
use crate::compressed::Compressed;
use crate::error::{CudaError, Error, Result};
use crate::image::Encoding;
use crate::nvtx::{self, Stage};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;
use std::time::Instant;

/// Timing events of one submission: the upload's start and end (on the upload's stream),
/// the kernels' start (on the compute stream, after waiting for the upload), after the
/// fused kernel, after conv2d, the JPEG decode's start and end (on the upload's stream,
/// before the upload; only when the submission has JPEG frames), after the download. The
/// last one means done.
pub(super) const EVENTS: usize = 8;
pub(super) const UPLOAD_START: usize = 0;
pub(super) const UPLOADED: usize = 1;
pub(super) const KERNELS_START: usize = 2;
pub(super) const PREPROCESSED: usize = 3;
pub(super) const CONVOLVED: usize = 4;
pub(super) const DECODE_START: usize = 5;
pub(super) const DECODED: usize = 6;
pub(super) const DONE: usize = EVENTS - 1;
/// Decode: the JPEG frames `jpegs` (slot index in `e.inputs`, frame) of entry `e`, whose
/// compressed bytes are staged, in ONE nvJPEG call into each slot's device buffer (tight
/// rows plus [`SRC_SLACK`]), on `up`, between the entry's decode events. Returns each
/// one's device address, in order.
///
/// # Safety
/// The entry is free (no GPU work of an earlier submission uses its buffers) and stays so
/// until this submission completes.
pub(crate) unsafe fn decode_jpegs(
    nv: &mut NvJpeg,
    e: &mut Entry,
    up: &Arc<CudaStream>,
    jpegs: &[(usize, &Compressed<'_>)],
) -> Result<Vec<CUdeviceptr>> {
    e.record(DECODE_START, up)?;
    let mut dsts = Vec::with_capacity(jpegs.len());
    for &(i, c) in jpegs {
        let len = c.step() as usize * c.height() as usize;
        let what = format!("the decoded JPEG of slot {i}");
        dsts.push(e.inputs[i].dev.ensure(up, len + SRC_SLACK, &what)?);
    }
    let items = jpegs
        .iter()
        .zip(&dsts)
        .map(|(&(i, c), &dst)| {
            Ok(DecodeItem {
                // SAFETY: staged bytes no GPU work writes; they stay untouched until the
                // submission completes (the precondition).
                jpeg: unsafe { e.inputs[i].staged(Source::Jpeg(c).staged_len()) }?,
                width: c.width(),
                height: c.height(),
                grey: c.encoding() == Encoding::Mono8,
                dst,
                pitch: c.step() as usize,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // SAFETY: each destination holds step * height (+ slack) bytes of this entry's device
    // memory and the JPEGs are this entry's pinned staging, both untouched until the
    // submission completes (the precondition); `up` is a stream of nvJPEG's context.
    unsafe { nv.decode_batch(up, &items) }?;
    e.record(DECODED, up)?;
    Ok(dsts)
}

/// One frame's buffers in a ring entry (or the batch's slot table): pinned host memory
/// the CPU stages into, and its copy on the device (`upload` mode; a decoded JPEG in
/// both modes).
#[derive(Default)]
pub(crate) struct Staging {
    pub(super) host: Option<PinnedBuffer>,
    /// This submission's frame, read in place from lent memory (nothing staged).
    pub(super) in_place: Option<InPlace>,
    /// A JPEG's compressed bytes (cached pinned memory: nvJPEG reads them on the host).
    pub(super) compressed: Option<PinnedBuffer>,
    pub(super) dev: DeviceBuffer,
}

impl Staging {
    /// The first `len` staged bytes of a JPEG.
    ///
    /// # Safety
    /// No GPU work writes the staging buffer while the slice is used.
    pub(crate) unsafe fn staged(&self, len: usize) -> Result<&[u8]> {
        match &self.compressed {
            // SAFETY: no GPU write is pending (the precondition).
            Some(h) if h.len() >= len => Ok(unsafe { &h.host()[..len] }),
            _ => Err(Error::misuse("decoding a JPEG", "it was not staged: stage it first")),
        }
    }

    /// Upload the first `len` staged bytes (or the frame read in place) on `up` and
    /// return the address the kernels read: the device copy (`len` + [`SRC_SLACK`]
    /// bytes), or in `mapped` mode the pinned buffer (the lent memory) itself. `what`
    /// names it in errors.
    ///
    /// # Safety
    /// No GPU work of an earlier submission may use the device copy (the ring entry is
    /// free), and the staged bytes stay alive and untouched until this submission
    /// completes.
    pub(crate) unsafe fn upload(
        &mut self,
        len: usize,
        up: &Arc<CudaStream>,
        what: &str,
    ) -> Result<CUdeviceptr> {
        if let Some(frame) = self.in_place {
            if let Some(d) = frame.device {
                return Ok(d);
            }
            let d = self.dev.ensure(up, len + SRC_SLACK, what)?;
            // SAFETY: the frame's `len` bytes lie in registered memory its source lent,
            // unchanged until this submission completes (the caller keeps the frame);
            // `d` as below.
            unsafe { sys::cuMemcpyHtoDAsync_v2(d, frame.host as *const _, len, up.cu_stream()) }
                .result()
                .map_err(|e| drv_err(format!("uploading {len} bytes of {what} in place"), e))?;
            return Ok(d);
        }
        let Some(host) = self.host.as_ref() else {
            return Err(Error::misuse(
                format!("uploading {what}"),
                "nothing was staged: stage it first",
            ));
        };
        if let Some(d) = host.device_ptr() {
            return Ok(d);
        }
        let d = self.dev.ensure(up, len + SRC_SLACK, what)?;
        // SAFETY: the pinned source holds `len` staged bytes and stays alive and
        // untouched until the submission completes; `d` has at least `len` bytes and no
        // earlier GPU work uses it (the precondition).
        unsafe { sys::cuMemcpyHtoDAsync_v2(d, host.host_ptr().cast(), len, up.cu_stream()) }
            .result()
            .map_err(|e| drv_err(format!("uploading {len} bytes of {what}"), e))?;
        Ok(d)
    }
}

/// One submission's sampling tables on the device (x then y: i0 | i1 | w1 bits, the
/// kernels' layout), uploaded on the compute stream (in order with the kernels that read
/// the old ones) only when they change: once per frame size.
#[derive(Default)]
pub(super) struct Tables {
    dev: DeviceBuffer,
    of: Option<(AxisMap, AxisMap)>,
}

impl Tables {
    /// The device address of `op`'s tables, and whether they were uploaded now. `op`
    /// has passed [`PreprocessOp::check`] for its frame: the kernels trust the tables.
    pub(super) fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        op: &PreprocessOp,
    ) -> Result<(CUdeviceptr, bool)> {
        if let (Some((x, y)), Some(d)) = (&self.of, self.dev.ptr(stream)) {
            if *x == op.x_map && *y == op.y_map {
                return Ok((d, false));
            }
        }
        let mut words: Vec<u8> = Vec::with_capacity(12 * (op.x_map.i0.len() + op.y_map.i0.len()));
        for m in [&op.x_map, &op.y_map] {
            words.extend(m.i0.iter().flat_map(|v| v.to_le_bytes()));
            words.extend(m.i1.iter().flat_map(|v| v.to_le_bytes()));
            words.extend(m.w1.iter().flat_map(|v| v.to_le_bytes()));
        }
        let d = self.dev.ensure(stream, words.len(), "sampling tables")?;
        // SAFETY: d has at least words.len() bytes; the source is pageable, so the call
        // returns only after the bytes have been staged and `words` may then be dropped.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(d, words.as_ptr().cast(), words.len(), stream.cu_stream())
        }
        .result()
        .map_err(|e| drv_err("uploading the sampling tables", e))?;
        self.of = Some((op.x_map.clone(), op.y_map.clone()));
        Ok((d, true))
    }

    /// The device address of the last tables, if any.
    pub(super) fn ptr(&self, stream: &CudaStream) -> Option<CUdeviceptr> {
        self.dev.ptr(stream)
    }
}

/// A ring entry: the buffers and timing events of one frame (the frame path: one input)
/// or one batch in flight.
pub(crate) struct Entry {
    /// Per frame (batch slot): its staging buffers.
    pub inputs: Vec<Staging>,
    /// The batch's slot table (unused by the frame path).
    pub table: Staging,
    /// The tensor(s) in host memory when they do not go to the caller's (see
    /// [`Gpu::destination`]).
    pub output: Option<PinnedBuffer>,
    /// See [`EVENTS`].
    events: [CudaEvent; EVENTS],
    pub in_flight: Option<InFlight>,
}

/// What is known of a submission in flight.
pub(crate) struct InFlight {
    /// Bytes of the tensor(s).
    pub len: usize,
    /// Host time of the stage step, microseconds.
    pub host_us: f32,
    /// The tensor(s) went straight to the caller's pinned memory, not to the entry's.
    pub direct: bool,
    /// The frame's encoding (its fused kernel), `None` for a batch: for the message of a
    /// failed submission.
    pub encoding: Option<Encoding>,
    /// JPEG frames were decoded on the device (the decode events were recorded).
    pub decoded: bool,
}

impl Entry {
    pub(crate) fn new(ctx: &Arc<CudaContext>, inputs: usize) -> Result<Self, CudaError> {
        let event = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| drv_err("cuEventCreate(timing)", e))
        };
        Ok(Entry {
            inputs: (0..inputs).map(|_| Staging::default()).collect(),
            table: Staging::default(),
            output: None,
            events: [
                event()?,
                event()?,
                event()?,
                event()?,
                event()?,
                event()?,
                event()?,
                event()?,
            ],
            in_flight: None,
        })
    }

    pub(super) fn record(&self, event: usize, on: &CudaStream) -> Result<(), CudaError> {
        self.events[event].record(on).map_err(|e| drv_err("cuEventRecord", e))
    }

    /// Start the upload step on `up`.
    pub(crate) fn begin_upload(&self, up: &CudaStream) -> Result<(), CudaError> {
        self.record(UPLOAD_START, up)
    }

    /// End the upload step on `up`: the compute stream waits for it when it ran on the
    /// copy stream, then the kernels' step starts.
    pub(crate) fn end_upload(
        &self,
        up: &Arc<CudaStream>,
        compute: &Arc<CudaStream>,
    ) -> Result<(), CudaError> {
        self.record(UPLOADED, up)?;
        if !Arc::ptr_eq(up, compute) {
            compute
                .wait(&self.events[UPLOADED])
                .map_err(|e| drv_err("cuStreamWaitEvent(upload)", e))?;
        }
        self.record(KERNELS_START, compute)
    }

    /// Wait for the submission queued on this entry to complete.
    pub(crate) fn wait(&self, what: &str) -> Result<(), CudaError> {
        self.events[DONE].synchronize().map_err(|e| drv_err(what, e))
    }

    /// Finish: wait for the submission in flight, copy its tensor(s) into `out` (exactly
    /// their length) unless they went to the caller's memory directly or `out` is `None`
    /// (read in place), and return its stage times (the upload with the host staging, the
    /// download with the copy out) with what was in flight.
    pub(crate) fn finish(&mut self, out: Option<&mut [u8]>) -> Result<(StageTimes, InFlight)> {
        let Some(f) = self.in_flight.take() else {
            return Err(Error::misuse(
                "finish",
                "nothing in flight on this ring entry: submit first",
            ));
        };
        let (what, kernel) = match f.encoding {
            Some(enc) => ("frame", resize_normalize_entry(enc)),
            None => ("batch", RESIZE_NORMALIZE_BATCH.to_string()),
        };
        let out = out.filter(|_| !f.direct);
        if let Some(wrong) = out.as_ref().map(|o| o.len()).filter(|&n| n != f.len) {
            let len = f.len;
            self.in_flight = Some(f); // A caller's mistake: the submission stays queued.
            return Err(Error::Operation(format!(
                "the output buffer holds {wrong} bytes but the {what}'s tensors are {len}; pass \
                 a buffer of exactly their length"
            )));
        }
        // The host side of the download: the wait for the whole submission, the copy out.
        let _range = nvtx::stage(Stage::Download);
        self.wait(&format!("running the {what} (upload, {kernel}, conv, download)"))?;
        let ms = |a: usize, b: usize| {
            self.events[a].elapsed_ms(&self.events[b]).map_err(|e| drv_err("cuEventElapsedTime", e))
        };
        let up = ms(UPLOAD_START, UPLOADED)?;
        // From the decode's start event, recorded before nvJPEG's host work, to its end on
        // the device: the host part and the device part (the upload's stream is idle when
        // a submission starts).
        let decode = if f.decoded { ms(DECODE_START, DECODED)? } else { 0.0 };
        let (pre, conv, down) =
            (ms(KERNELS_START, PREPROCESSED)?, ms(PREPROCESSED, CONVOLVED)?, ms(CONVOLVED, DONE)?);
        let t = Instant::now();
        if let Some(out) = out {
            // SAFETY: the submission's last event has completed: nothing writes it.
            parallel_copy(out, &unsafe { self.output_bytes() }?[..f.len]);
        }
        let times = StageTimes {
            decode_us: decode * 1e3,
            upload_us: f.host_us + up * 1e3,
            preprocess_us: pre * 1e3,
            conv_us: conv * 1e3,
            download_us: down * 1e3 + t.elapsed().as_secs_f32() * 1e6,
        };
        Ok((times, f))
    }

    /// The bytes of the entry's output.
    ///
    /// # Safety
    /// No GPU work that writes the output may be pending.
    pub(crate) unsafe fn output_bytes(&self) -> Result<&[u8]> {
        let o = self
            .output
            .as_ref()
            .ok_or_else(|| Error::misuse("finish", "ring entry output missing"))?;
        // SAFETY: no GPU write is pending (the precondition).
        Ok(unsafe { o.host() })
    }
}

/// Submissions that can be in flight at once: the ring of entries lets the CPU stage
/// submission k+1 while the GPU still works on submission k.
pub(crate) const RING: usize = 2;

/// The ring of entries, frames and batches alike, taken in turn. One policy: a
/// submission takes the next free entry (its previous submission finished, or abandoned
/// once both streams were waited for: [`Ring::abandon`]), and is refused (`Misuse`) when
/// every entry is in flight (finish the oldest first).
pub(super) struct Ring {
    entries: Vec<Entry>,
    next: usize,
}

impl Ring {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Self, CudaError> {
        let entries = (0..RING).map(|_| Entry::new(ctx, 1)).collect::<Result<_, _>>()?;
        Ok(Ring { entries, next: 0 })
    }

    /// The next free entry, from the one after the last taken; `Misuse` when every entry
    /// is in flight.
    pub(super) fn take(&mut self) -> Result<usize> {
        let n = self.entries.len();
        let free =
            (0..n).map(|k| (self.next + k) % n).find(|&r| self.entries[r].in_flight.is_none());
        let Some(r) = free else {
            return Err(Error::misuse(
                "submit_to",
                format!("{n} submissions already in flight: finish_oldest one first"),
            ));
        };
        self.next = (r + 1) % n;
        Ok(r)
    }

    /// Whether any entry has a submission in flight.
    pub(super) fn busy(&self) -> bool {
        self.entries.iter().any(|e| e.in_flight.is_some())
    }

    /// Entry `r`.
    pub(super) fn entry(&mut self, r: usize) -> &mut Entry {
        &mut self.entries[r]
    }

    /// Forget every submission in flight (both streams already waited for).
    pub(super) fn abandon(&mut self) {
        for e in &mut self.entries {
            e.in_flight = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JPEG that was not staged: a misuse of the steps (they stage before they decode),
    /// never a device failure; reachable without a GPU.
    #[test]
    fn decoding_what_was_not_staged_is_a_misuse() {
        let staging = Staging::default();
        // SAFETY: no GPU work exists (nothing was staged).
        let e = unsafe { staging.staged(16) }.unwrap_err();
        assert!(matches!(e, Error::Misuse { .. }), "{e:?}");
        assert!(!e.is_device_failure());
        assert_eq!(e.to_string(), "decoding a JPEG: it was not staged: stage it first");
    }
}
