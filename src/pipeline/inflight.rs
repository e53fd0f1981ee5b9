//! The frame sets in flight, owned by the pipeline: [`InFlight`] queues each set with its
//! frames ([`FrameSet`]) and the state of its work, `push` returns what finished, `drain`
//! finishes the rest. The node's processing thread and `replay` both push sets and
//! publish what comes out; neither keeps a queue of its own.
//!
//! A set's frames stay with it until it is finished because a device error may discard
//! its work (and that of every set submitted after it): it then runs again from its
//! frames, on the rebuilt or fallback backend (`gpu_failure_policy`).

use super::{FrameInput, Pipeline, Processed};
use crate::backend::{StageTimes, TensorDesc};
use crate::error::{Error, Result};
use crate::handoff::{BlockMemory, Lease};
use crate::pipeline::geometry::Geometry;
use crate::pipeline::message::{MessageBuf, OwnedMessage};
use crate::pipeline::Rejected;
use std::collections::VecDeque;

/// A frame set the pipeline can read again until it is finished: one frame per input
/// (a single camera: one), each with its header and topic.
pub trait FrameSet {
    /// Calls `f` with the set's inputs, in input order (`image: None` for a slot without
    /// a usable frame: a batch pads it). The same inputs every call.
    fn with_inputs<R>(&self, f: impl FnOnce(&[FrameInput<'_, '_>]) -> R) -> R;

    /// Called once the set is queued on the backend, before any older set is finished:
    /// a set whose tensors go to a shared block with an interprocess event can send its
    /// `TensorRef` now ([`Announce::send`]). By default nothing is sent.
    fn submitted(&mut self, _announce: &mut Announce<'_>) {}
}

/// Where a set's tensors go: the message, and/or a shared block (`tensor_ref`,
/// docs/HANDOFF.md), copied into the message too when `fill` (`tensor` has subscribers).
pub struct Outputs {
    /// The shared block, if the set has one.
    pub block: Option<Lease>,
    /// Write the tensors into the message (always, without a block).
    pub fill: bool,
}

impl Outputs {
    /// The tensors in the message only.
    pub fn message() -> Self {
        Outputs { block: None, fill: true }
    }
}

/// A set that left the pipeline: finished, or refused when it was pushed.
pub struct Finished<S> {
    /// The set as pushed (with what [`FrameSet::submitted`] recorded).
    pub set: S,
    /// Its outcome: the processed set and its message (`Tensor` or `TensorBatch`, to
    /// publish), or why there is none. An error of kind [`Error::Image`] is a single
    /// camera's frame that the configuration refuses (its roi); [`Error::GpuFailure`]
    /// is `gpu_failure_policy: exit`.
    pub result: Result<(Processed, OwnedMessage)>,
}

/// The set just submitted, for [`FrameSet::submitted`].
pub struct Announce<'a> {
    pending: &'a mut Pending,
}

impl Announce<'_> {
    /// Send the set's `TensorRef` now, before its GPU work ends, when its tensors go to
    /// a shared block with an interprocess event (CUDA): `publish` gets the serialized
    /// `TensorRef` (with `ages` per item and the event's handle) and says whether it went
    /// out. Then the finished message does not describe it again
    /// ([`OwnedMessage::tensor_ref`] is `None`, [`OwnedMessage::announced`] true), and if
    /// the set fails its block is withdrawn. False when nothing went out (no such block,
    /// the set failed already, or `publish` said no).
    pub fn send(&mut self, ages: &[f32], publish: impl FnOnce(&[u8]) -> bool) -> bool {
        let p = &mut *self.pending;
        let announced = p.message.block.as_ref().is_some_and(Lease::announced);
        if announced || !matches!(p.state, PendingState::InFlight) {
            return false;
        }
        let Some(event) = p.message.block.as_mut().and_then(Lease::memory).and_then(|m| match m {
            BlockMemory::Device(_, _, event) => event,
            BlockMemory::Host(_) => None,
        }) else {
            return false;
        };
        let Some(cdr) = p.message.tensor_ref(ages, &event.handle) else { return false };
        if !publish(&cdr) {
            return false;
        }
        if let Some(block) = p.message.block.as_mut() {
            block.announce();
            block.signal(&cdr);
        }
        true
    }
}

/// A set submitted to the backend and not finished: its message (the tensors land in it,
/// or in its block) and the state of its work.
pub(super) struct Pending {
    /// Its number (the NVTX ranges' `frame N`).
    pub(super) set: u64,
    pub(super) message: MessageBuf,
    pub(super) desc: TensorDesc,
    pub(super) geometries: Vec<Option<Geometry>>,
    pub(super) rejected: Rejected,
    pub(super) state: PendingState,
}

pub(super) enum PendingState {
    /// Computed when submitted (a backend with one submission in flight): its times.
    Done(StageTimes),
    /// In flight on the backend: [`crate::backend::Backend::finish_oldest`] gives its
    /// times.
    InFlight,
    /// The backend failed when it was submitted: the failure policy acts at its finish.
    Failed(Error),
    /// Another submission's device error discarded it (or its backend was replaced): it
    /// is run again at its finish.
    Abandoned,
}

/// The sets in flight besides the one being submitted or finished: what a device error
/// or a backend replacement must reach ([`Pipeline::submit`], [`Pipeline::finish`]).
pub(super) trait Others {
    /// Calls `f` on each of them, oldest first.
    fn each(&mut self, f: &mut dyn FnMut(&mut Pending));
}

/// No other set in flight ([`Pipeline::process_frames`]).
pub(super) struct NoOthers;

impl Others for NoOthers {
    fn each(&mut self, _f: &mut dyn FnMut(&mut Pending)) {}
}

struct Entry<S> {
    set: S,
    pending: Pending,
}

impl<S> Others for VecDeque<Entry<S>> {
    fn each(&mut self, f: &mut dyn FnMut(&mut Pending)) {
        for e in self {
            f(&mut e.pending);
        }
    }
}

/// The pipeline with the sets in flight: up to [`Pipeline::max_in_flight`] (2 on CUDA:
/// set k+1 is staged and uploaded while set k computes; 1 on the CPU, which computes a
/// set when it is submitted), finished in the order they were pushed.
pub struct InFlight<S> {
    pipeline: Pipeline,
    queue: VecDeque<Entry<S>>,
}

impl<S: FrameSet> InFlight<S> {
    /// `pipeline` with nothing in flight.
    pub fn new(pipeline: Pipeline) -> Self {
        InFlight { pipeline, queue: VecDeque::new() }
    }

    /// The pipeline (its configuration, backend, shared pools).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Sets submitted and not finished.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Nothing in flight.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The sets in flight, oldest first.
    pub fn sets(&self) -> impl Iterator<Item = &S> {
        self.queue.iter().map(|e| &e.set)
    }

    /// Whether `held` more sets (finished, their messages not handed on yet) and this
    /// queue leave room for another set on the backend.
    pub(crate) fn has_room(&self, held: usize) -> bool {
        self.queue.len() + held < self.pipeline.max_in_flight()
    }

    /// Submit `set` (its operations resolved, its message written around the tensors,
    /// the backend's work queued; [`FrameSet::submitted`] called), then finish the oldest
    /// sets until there is room for the next one. Returns what left the pipeline, oldest
    /// first: the finished sets and, when the set was refused (its frame, an operation
    /// error), the set itself with the error. A device error is not a refusal: the
    /// set's finish handles it (`gpu_failure_policy`).
    pub fn push(&mut self, mut set: S, outputs: Outputs) -> Vec<Finished<S>> {
        // There is room: every push ends with fewer sets in flight than the backend takes.
        let InFlight { pipeline, queue } = self;
        let mut out = Vec::new();
        match set.with_inputs(|items| pipeline.submit(items, outputs, queue)) {
            Ok(mut pending) => {
                set.submitted(&mut Announce { pending: &mut pending });
                queue.push_back(Entry { set, pending });
            }
            Err(e) => out.push(Finished { set, result: Err(e) }),
        }
        while !self.has_room(0) {
            out.extend(self.finish_oldest());
        }
        out
    }

    /// Wait for the oldest set and finish it (`None`: nothing in flight). A device error
    /// starts `gpu_failure_policy` on this set (run again on the rebuilt or fallback
    /// backend); the sets submitted after it run again at their own finish.
    pub fn finish_oldest(&mut self) -> Option<Finished<S>> {
        let InFlight { pipeline, queue } = self;
        let Entry { set, pending } = queue.pop_front()?;
        let result = set
            .with_inputs(|items| pipeline.finish(pending, items, queue))
            .map(|processed| (processed, pipeline.take_message()));
        Some(Finished { set, result })
    }

    /// Finish every set in flight, oldest first.
    pub fn drain(&mut self) -> Vec<Finished<S>> {
        std::iter::from_fn(|| self.finish_oldest()).collect()
    }

    /// Replace the configuration ([`Pipeline::set_config`]) for the sets pushed from now
    /// on; [`InFlight::drain`] first: with sets in flight it is refused.
    pub(crate) fn set_config(&mut self, config: crate::Config) -> Result<()> {
        if !self.queue.is_empty() {
            let n = self.queue.len();
            return Err(Error::misuse(
                "set_config",
                format!("{n} set(s) in flight: drain them first"),
            ));
        }
        self.pipeline.set_config(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::image::ImageView;
    use crate::pipeline::deferred::Deferred;
    use crate::wire::msgs::Header;
    use crate::Config;

    /// A set of 8x4 rgb8 frames it owns, one per topic, pixels `v + camera index`.
    struct Owned {
        topics: Vec<String>,
        data: Vec<Vec<u8>>,
        header: Header,
        submitted: bool,
    }

    fn set(topics: &[&str], v: u8, stamp: i32) -> Owned {
        Owned {
            topics: topics.iter().map(|t| t.to_string()).collect(),
            data: (0..topics.len()).map(|i| vec![v + i as u8; 8 * 4 * 3]).collect(),
            header: Header { sec: stamp, nanosec: 0, frame_id: "cam".into() },
            submitted: false,
        }
    }

    impl FrameSet for Owned {
        fn with_inputs<R>(&self, f: impl FnOnce(&[FrameInput<'_, '_>]) -> R) -> R {
            let images: Vec<ImageView<'_>> = self
                .data
                .iter()
                .map(|d| ImageView::new(8, 4, 24, "rgb8", false, d).expect("image"))
                .collect();
            let inputs: Vec<FrameInput<'_, '_>> = self
                .topics
                .iter()
                .zip(&images)
                .map(|(topic, image)| FrameInput {
                    topic,
                    image: Some(image.into()),
                    header: &self.header,
                    source_encoding: "rgb8",
                    repeated: false,
                })
                .collect();
            f(&inputs)
        }

        fn submitted(&mut self, announce: &mut Announce<'_>) {
            self.submitted = true;
            assert!(!announce.send(&[1.0], |_| true), "no shared block: nothing to announce");
        }
    }

    fn config(topics: &[&str]) -> Config {
        Config {
            network_image_width: 16,
            network_image_height: 8,
            inputs: if topics.len() > 1 {
                topics.iter().map(|t| t.to_string()).collect()
            } else {
                vec![]
            },
            ..Config::default()
        }
    }

    fn bytes(f: &Finished<Owned>) -> Vec<u8> {
        match &f.result {
            Ok((_, message)) => message.bytes().to_vec(),
            Err(e) => panic!("set {}: {e}", f.set.header.sec),
        }
    }

    #[test]
    fn two_sets_in_flight_finish_in_order_each_as_if_alone() {
        for topics in [&["image"][..], &["a/image", "b/image"][..]] {
            // What each set gives alone (synchronous CPU).
            let mut alone =
                Pipeline::new(config(topics), Box::new(CpuBackend::new())).expect("cpu");
            let want: Vec<Vec<u8>> = [(10, 1), (90, 2), (200, 3)]
                .iter()
                .map(|&(v, t)| {
                    set(topics, v, t).with_inputs(|i| alone.process_frames(i)).expect("alone");
                    alone.message().to_vec()
                })
                .collect();
            let deferred = Pipeline::new(config(topics), Box::new(Deferred::new())).expect("p");
            let mut q = InFlight::new(deferred);
            assert_eq!(q.pipeline().max_in_flight(), 2);
            assert!(q.push(set(topics, 10, 1), Outputs::message()).is_empty(), "set 1 in flight");
            assert_eq!(q.len(), 1);
            // The second set is submitted before the first is finished; then the first
            // finishes, leaving room for the next.
            let out = q.push(set(topics, 90, 2), Outputs::message());
            assert_eq!(out.len(), 1);
            assert_eq!(bytes(&out[0]), want[0], "{topics:?}: set 1");
            assert!(out[0].set.submitted, "FrameSet::submitted was called");
            assert_eq!(q.len(), 1, "never more than max_in_flight sets in flight");
            let first = out;
            let out = q.push(set(topics, 200, 3), Outputs::message());
            assert_eq!(bytes(&out[0]), want[1], "{topics:?}: set 2");
            let busy = q.set_config(config(topics)).unwrap_err();
            assert!(busy.to_string().contains("drain them first"), "{busy}");
            assert!(!busy.is_device_failure());
            let rest = q.drain();
            assert_eq!((rest.len(), q.len()), (1, 0));
            assert_eq!(bytes(&rest[0]), want[2], "{topics:?}: set 3");
            assert_eq!(bytes(&first[0]), want[0], "the first message stayed");
            assert!(q.finish_oldest().is_none(), "nothing in flight");
            q.set_config(config(topics)).expect("drained: the configuration can change");
        }
    }

    #[test]
    fn a_refused_set_comes_back_at_once_with_its_error_and_the_next_runs() {
        // A single camera whose roi does not fit an 8x4 frame: refused at submission.
        let cfg = Config { roi: vec![0, 0, 100, 100], ..config(&["image"]) };
        let mut q = InFlight::new(Pipeline::new(cfg, Box::new(CpuBackend::new())).expect("p"));
        let out = q.push(set(&["image"], 10, 1), Outputs::message());
        assert_eq!((out.len(), q.len()), (1, 0));
        let Err(e) = &out[0].result else { panic!("the set was not refused") };
        assert!(matches!(e, Error::Image(_)), "{e}");
        assert!(!out[0].set.submitted, "a refused set is not submitted");
        q.set_config(config(&["image"])).expect("config");
        let out = q.push(set(&["image"], 10, 2), Outputs::message());
        assert_eq!(out.len(), 1, "the CPU finishes a set when it is pushed");
        assert!(out[0].result.is_ok() && out[0].set.submitted);
    }
}
