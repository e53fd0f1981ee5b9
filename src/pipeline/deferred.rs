//! Test hook (feature `fault-injection`, and the unit tests): `Deferred`, the CPU
//! backend behind the pipelined interface of the CUDA backend.

use crate::backend::{BatchWork, FrameWork, Job, Queued, StageTimes};
use crate::error::{Error, Result};

/// The environment variable of [`Deferred`]: `1` makes `backend: cpu` defer its work.
#[cfg(feature = "fault-injection")]
pub(crate) const DEFERRED_CPU_ENV: &str = "VISION_PREPROC_TEST_DEFERRED_CPU";

/// Test hook (feature `fault-injection`; `VISION_PREPROC_TEST_DEFERRED_CPU=1` with
/// `backend: cpu`): the CPU backend behind the pipelined interface of the CUDA backend,
/// so that the node's and replay's overlapped path (two sets in flight, set k+1 submitted
/// before set k is finished) runs on a machine without a GPU. `submit_into` stages (copies)
/// the frames, as the CUDA backend does, and computes nothing; `finish_oldest` computes
/// the oldest job into its `out`. The tensors are the CPU backend's, bit for bit.
pub(crate) struct Deferred {
    cpu: crate::backend::cpu::CpuBackend,
    queue: std::collections::VecDeque<DeferredJob>,
}

/// One staged job of [`Deferred`].
struct DeferredJob {
    /// Per slot: the staged frame (width, height, step, encoding, big endian, bytes) and
    /// its operation; a frame job has one slot with a frame.
    slots: Vec<(Option<StagedFrame>, crate::backend::PreprocessOp)>,
    batch: bool,
    conv: Option<crate::backend::Conv2dOp>,
    out: *mut u8,
    len: usize,
}

// SAFETY: `out` is the caller's destination, kept valid and untouched until the job is
// finished or abandoned (the contract of `Backend::submit_into`); the backend is used by
// one thread at a time.
unsafe impl Send for DeferredJob {}

struct StagedFrame {
    size: (u32, u32, u32),
    encoding: crate::image::Encoding,
    big_endian: bool,
    data: Vec<u8>,
}

impl StagedFrame {
    /// `frame` staged: its pixels copied, a compressed frame decoded (on the host, as the
    /// CUDA backend's fallback does).
    fn of(frame: crate::backend::Frame<'_, '_>) -> Result<Self> {
        let pixels = crate::backend::HostPixels::of(frame)?;
        let image = &pixels.view();
        Ok(StagedFrame {
            size: (image.width(), image.height(), image.step()),
            encoding: image.encoding(),
            big_endian: image.big_endian(),
            data: image.data().to_vec(),
        })
    }

    fn view(&self) -> Result<crate::image::ImageView<'_>> {
        let (w, h, step) = self.size;
        Ok(crate::image::ImageView::with_encoding(
            w,
            h,
            step,
            self.encoding,
            self.big_endian,
            &self.data,
        )?)
    }
}

impl Deferred {
    /// The CPU backend, deferred.
    pub(crate) fn new() -> Self {
        Deferred {
            cpu: crate::backend::cpu::CpuBackend::new(),
            queue: std::collections::VecDeque::new(),
        }
    }

    /// Defer the CPU backend's work when [`DEFERRED_CPU_ENV`] is `1`.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn from_env() -> Option<Self> {
        (std::env::var(DEFERRED_CPU_ENV).as_deref() == Ok("1")).then(Self::new)
    }
}

impl Default for Deferred {
    fn default() -> Self {
        Self::new()
    }
}

impl crate::backend::Backend for Deferred {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_description(&self) -> String {
        format!(
            "{} (test hook: work deferred to finish, 2 in flight)",
            self.cpu.device_description()
        )
    }

    fn diagnostics(&self) -> Vec<(String, String)> {
        self.cpu.diagnostics()
    }

    fn process_into(&mut self, work: FrameWork<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
        self.cpu.process_into(work, out)
    }

    fn process_batch_into(&mut self, w: BatchWork<'_, '_>, out: &mut [u8]) -> Result<StageTimes> {
        self.cpu.process_batch_into(w, out)
    }

    fn max_in_flight(&self) -> usize {
        2
    }

    unsafe fn submit_to(&mut self, job: Job<'_, '_>, out: crate::backend::Out) -> Result<Queued> {
        let crate::backend::Out::Host { ptr: out, len } = out else {
            return Err(Error::misuse(
                "submit_to",
                "the deferred cpu backend has no device memory; pass Out::Host",
            ));
        };
        if self.queue.len() >= 2 {
            return Err(Error::misuse(
                "submit_into",
                "2 jobs already in flight; finish_oldest first",
            ));
        }
        let (slots, batch, conv) = match job {
            Job::Frame(FrameWork { image, op, conv }) => {
                crate::backend::check_out_len(op, len)?;
                op.check(image)?;
                (vec![(Some(StagedFrame::of(image)?), op.clone())], false, conv)
            }
            Job::Batch(BatchWork { slots, conv }) => {
                crate::backend::check_batch_len(slots, len)?;
                let staged = slots
                    .iter()
                    .map(|s| Ok((s.image.map(StagedFrame::of).transpose()?, s.op.clone())))
                    .collect::<Result<Vec<_>>>()?;
                (staged, true, conv)
            }
        };
        conv.map_or(Ok(()), crate::backend::Conv2dOp::check)?;
        self.queue.push_back(DeferredJob { slots, batch, conv: conv.cloned(), out, len });
        Ok(Queued::Pending)
    }

    fn finish_oldest(&mut self) -> Result<crate::backend::StageTimes> {
        let Some(job) = self.queue.pop_front() else {
            return Err(Error::misuse("finish_oldest", "nothing in flight; submit first"));
        };
        // SAFETY: the caller keeps `out` valid and untouched until this returns (the
        // contract of submit_into).
        let out = unsafe { std::slice::from_raw_parts_mut(job.out, job.len) };
        let views = job
            .slots
            .iter()
            .map(|(f, _)| f.as_ref().map(StagedFrame::view).transpose())
            .collect::<Result<Vec<_>>>()?;
        let conv = job.conv.as_ref();
        if !job.batch {
            if let (Some(Some(image)), Some((_, op))) = (views.first(), job.slots.first()) {
                return self.cpu.process_into(FrameWork::new(image, op, conv), out);
            }
            return Err(Error::misuse("finish_oldest", "a deferred frame job without its frame"));
        }
        let slots: Vec<crate::backend::BatchSlot<'_, '_>> = views
            .iter()
            .zip(&job.slots)
            .map(|(image, (_, op))| crate::backend::BatchSlot {
                image: image.as_ref().map(crate::backend::Frame::Pixels),
                op,
            })
            .collect();
        self.cpu.process_batch_into(BatchWork::new(&slots, conv), out)
    }

    fn abandon_all(&mut self) {
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, Out};
    use crate::config::Config;
    use crate::image::ImageView;
    use crate::pipeline::{preprocess_op, Geometry};

    #[test]
    fn its_misuses_are_misuse_not_device_failures() {
        let misuse = |call: &str, e: Error| {
            assert!(matches!(&e, Error::Misuse { call: c, .. } if c == call), "{e:?}");
            assert!(!e.is_device_failure(), "{e:?}");
        };
        let mut b = Deferred::new();
        misuse("finish_oldest", b.finish_oldest().unwrap_err());
        let data = [7u8; 4 * 4 * 3];
        let image = ImageView::new(4, 4, 12, "rgb8", false, &data).unwrap();
        let cfg = Config { network_image_width: 2, network_image_height: 2, ..Config::default() };
        let mut op = preprocess_op(&cfg, &Geometry::resolve(&cfg, 4, 4).unwrap());
        op.params.set_source(&image);
        let mut outs = vec![vec![0u8; op.params.tensor_desc().byte_len()]; 3];
        let job = || Job::Frame(FrameWork::new(&image, &op, None));
        let device = Out::Device { ptr: 0, len: outs[0].len(), host: None, ready: None };
        // SAFETY: refused before anything is written.
        misuse("submit_to", unsafe { b.submit_to(job(), device) }.unwrap_err());
        for (i, out) in outs.iter_mut().enumerate() {
            let host = Out::Host { ptr: out.as_mut_ptr(), len: out.len() };
            // SAFETY: `outs` outlives the jobs, finished or abandoned below.
            let queued = unsafe { b.submit_to(job(), host) };
            match i {
                0 | 1 => assert!(matches!(queued, Ok(Queued::Pending)), "{queued:?}"),
                _ => misuse("submit_into", queued.unwrap_err()),
            }
        }
        b.finish_oldest().unwrap();
        b.finish_oldest().unwrap();
        misuse("finish_oldest", b.finish_oldest().unwrap_err());
        assert_eq!(outs[0], outs[1]);
    }
}
