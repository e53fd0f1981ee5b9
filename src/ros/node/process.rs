//! The processing thread, the same for one camera and for N. It owns the pipeline's sets
//! in flight ([`InFlight`], and so the backend and its streams): it pushes the newest
//! formed set (a `Tensor` for one input, a `TensorBatch` for 2+, serialized in place) and
//! hands what comes out to the publishing thread (`publish.rs`), while the pipeline
//! computes the next set into another message buffer. The hand-over waits until the
//! publishing thread is free, so at most one set is being published; sets formed
//! meanwhile replace each other in the keep-latest slot (counted as dropped).

use super::handoff::{Handoff, SetOutputs};
use super::publish::{ages, publish_loop, Ready, ReadySlot};
use super::shared::Formed;
use super::shared::{lock, Invalid, Outputs, RateLimitedLog, Received, Shared};
use crate::pipeline::{
    self, slot_reason, Announce, Finished, FrameInput, FrameSet, FrameView, GpuFailure, InFlight,
    Pipeline,
};
use crate::transport::batch_sync::Item;
use crate::wire::msgs::Header;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::time::Instant;

/// One input of a formed set as the processing thread sees it.
struct Slot<'a> {
    frame: Option<&'a Received>,
    repeated: bool,
    header: Header,
}

/// Run the node's processing (this thread) and publishing (a second thread) until the
/// node stops.
pub(super) fn process_loop(
    pipeline: Pipeline,
    shared: &Shared,
    out: Outputs,
    handoff: Option<Handoff>,
) {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Ready>(0);
    std::thread::scope(|scope| {
        let publisher = std::thread::Builder::new()
            .name("publish".into())
            .spawn_scoped(scope, move || publish_loop(&rx, shared, &out));
        match publisher {
            Ok(_) => process(pipeline, shared, &tx, handoff),
            Err(e) => shared.exit_fatal(format!("starting the publishing thread: {e}"), 0),
        }
        drop(tx); // the publishing thread publishes what it has, then ends
    });
}

/// A frame refused (`what`: why, after the kind of refusal `kind` in the log line):
/// logged (rate limited), counted for the node and its camera. The camera's topic is
/// named with 2+ inputs.
fn reject(
    shared: &Shared,
    log: &mut RateLimitedLog,
    topics: &[String],
    slot: usize,
    what: (&str, &str),
) {
    let (kind, why) = what;
    let reason = slot_reason(topics, slot, why);
    log.error(&shared.logger, &format!("frame rejected: {kind}{reason}"));
    shared.stats.rejected(reason);
    lock(&shared.cameras)[slot].rejected += 1;
}

/// A formed set in the pipeline: its frames, which were valid when it was pushed, what
/// it counts, and when its `TensorRef` went out.
struct NodeSet<'c> {
    formed: Formed,
    ctx: &'c Context<'c>,
    /// Per slot: its frame was valid when pushed (an invalid one was rejected then).
    valid: Vec<bool>,
    /// Its valid frames not in an earlier set (counted failed if it fails).
    new_valid: u64,
    /// When its `TensorRef` went out, if before its work ended.
    announced_at: Option<Instant>,
}

impl FrameSet for NodeSet<'_> {
    fn with_inputs<R>(&self, f: impl FnOnce(&[FrameInput<'_, '_>]) -> R) -> R {
        let slots = slots_of(&self.formed);
        let views: Vec<Option<FrameView<'_>>> = slots
            .iter()
            .zip(&self.valid)
            .map(|(s, &valid)| s.frame.filter(|_| valid).and_then(|f| f.image.view().ok()))
            .collect();
        f(&inputs_of(&slots, &views, self.ctx.topics))
    }

    /// A set written into a shared block with an interprocess event (CUDA): its
    /// `TensorRef` goes out now, before its GPU work ends (consumers wait for the event),
    /// with each item's age now.
    fn submitted(&mut self, announce: &mut Announce<'_>) {
        let (Some(handoff), shared) = (self.ctx.handoff.as_ref(), self.ctx.shared) else { return };
        let ages = ages(shared, slots_of(&self.formed).iter().map(|s| &s.header));
        if announce.send(&ages, |cdr| handoff.borrow_mut().announce(cdr, shared)) {
            self.announced_at = Some(Instant::now());
        }
    }
}

/// The processing thread: pushes the newest formed set into the pipeline and hands
/// what comes out to the publishing thread. With a backend that keeps two sets in flight
/// (CUDA), a set that is waiting when the previous one is finished is pushed before that
/// one is handed over (the hand-over waits for the publishing thread), so that its
/// staging, upload and GPU work overlap the previous set's publishing. A set is never
/// waited for while another is waiting to be pushed; with none waiting it is finished at
/// once: at camera rate each set is finished right after its submission.
fn process(pipeline: Pipeline, shared: &Shared, tx: &SyncSender<Ready>, handoff: Option<Handoff>) {
    let mut generation = 0u64;
    let mut log = RateLimitedLog::new(&shared.clock);
    let topics: Vec<String> = lock(&shared.cameras).iter().map(|c| c.topic.clone()).collect();
    let ctx = Context { shared, topics: &topics, tx, handoff: handoff.map(RefCell::new) };
    let mut sets = InFlight::new(pipeline);
    loop {
        // Parameters set at run time apply from the next set pushed (validated when
        // set), after the sets in flight are finished with the old ones.
        if lock(&shared.params).generation != generation {
            let done = sets.drain();
            if !ctx.hand_over(&mut sets, done, None, &mut log) {
                return;
            }
            apply_params(&mut sets, shared, &mut generation);
        }
        let formed = if sets.is_empty() {
            let Some(formed) = shared.sets.take() else { break };
            // Set while this thread waited for the set: nothing is in flight.
            apply_params(&mut sets, shared, &mut generation);
            Some(formed)
        } else {
            let waiting = shared.sets.try_take();
            if waiting.is_some() {
                shared.stats.overlapped.fetch_add(1, Ordering::Relaxed);
            }
            waiting
        };
        let done = match formed {
            Some(formed) => ctx.push(&mut sets, formed, &mut log),
            None => sets.finish_oldest().into_iter().collect(),
        };
        if !ctx.hand_over(&mut sets, done, Some(generation), &mut log) {
            return;
        }
    }
    // Stopped: what is in flight is finished and handed over (the publishing thread
    // publishes it before it ends).
    let done = sets.drain();
    ctx.hand_over(&mut sets, done, None, &mut log);
}

/// Apply the parameters set at run time (validated when set) when their generation is
/// not `generation` (then updated); call with no set in flight.
fn apply_params(sets: &mut InFlight<NodeSet<'_>>, shared: &Shared, generation: &mut u64) {
    let p = lock(&shared.params);
    if p.generation == *generation {
        return;
    }
    *generation = p.generation;
    if let Err(e) = sets.set_config(p.config.clone()) {
        r2r::log_error!(shared.logger.as_str(), "new parameters not applied: {e}");
    }
}

/// What a set that left the pipeline gave.
enum Outcome {
    /// The set, for the publishing thread.
    Ready(Box<Ready>),
    /// Nothing to publish (the set was refused or failed: counted).
    Nothing,
    /// The node exits (`gpu_failure_policy: exit`).
    Stop,
}

/// What the processing thread's steps share.
struct Context<'a> {
    shared: &'a Shared,
    topics: &'a [String],
    tx: &'a SyncSender<Ready>,
    /// The shared output blocks (`tensor_ref`), if the node has them.
    handoff: Option<RefCell<Handoff>>,
}

/// One input of a formed set as the processing thread sees it.
fn slots_of(formed: &Formed) -> Vec<Slot<'_>> {
    formed
        .batch
        .items
        .iter()
        .map(|item| match item {
            Item::Frame { frame, repeated } => Slot {
                frame: Some(frame.data.as_ref()),
                repeated: *repeated,
                header: frame.data.header.clone(),
            },
            Item::Stale => Slot { frame: None, repeated: false, header: Header::default() },
        })
        .collect()
}

/// The pipeline's inputs of `slots` with their `views` (`None`: no frame, or invalid).
fn inputs_of<'a, 'b>(
    slots: &'b [Slot<'a>],
    views: &'b [Option<FrameView<'a>>],
    topics: &'b [String],
) -> Vec<FrameInput<'a, 'b>> {
    slots
        .iter()
        .zip(views)
        .enumerate()
        .map(|(i, (s, v))| FrameInput {
            topic: &topics[i],
            image: v.as_ref().map(FrameView::frame),
            header: &s.header,
            source_encoding: s.frame.map_or("", |f| f.encoding.as_str()),
            repeated: s.repeated,
        })
        .collect()
}

impl<'c> Context<'c> {
    /// Push a formed set into the pipeline (its invalid frames rejected first: a single
    /// camera's is not pushed) and return what left the pipeline.
    fn push(
        &'c self,
        sets: &mut InFlight<NodeSet<'c>>,
        formed: Formed,
        log: &mut RateLimitedLog,
    ) -> Vec<Finished<NodeSet<'c>>> {
        let (shared, topics) = (self.shared, self.topics);
        let slots = slots_of(&formed);
        // An invalid frame is rejected (a batch slot is padded).
        let mut valid = Vec::with_capacity(slots.len());
        for (i, s) in slots.iter().enumerate() {
            valid.push(match s.frame.map(|f| f.image.view()) {
                Some(Ok(_)) => true,
                Some(Err(e)) => {
                    if !s.repeated {
                        if let Invalid::Decode(d) = &e {
                            shared.stats.undecodable(d.kind());
                        }
                        reject(shared, log, topics, i, (e.kind(), &e.to_string()));
                    }
                    false
                }
                None => false,
            });
        }
        if topics.len() < 2 && !valid[0] {
            return Vec::new(); // a single camera's invalid frame: nothing to publish
        }
        let new_valid = slots.iter().zip(&valid).filter(|(s, &v)| v && !s.repeated).count() as u64;
        drop(slots);
        let outputs =
            match self.handoff.as_ref().map(|h| h.borrow_mut().outputs(sets.pipeline(), shared)) {
                None => pipeline::Outputs::message(),
                Some(SetOutputs::Go { block, fill }) => pipeline::Outputs { block, fill },
                Some(SetOutputs::NoBlock) => {
                    // Only tensor_ref is wanted and its consumers hold every block.
                    shared.stats.dropped.fetch_add(new_valid, Ordering::Relaxed);
                    shared.stats.dropped_no_block.fetch_add(new_valid, Ordering::Relaxed);
                    return Vec::new();
                }
            };
        let set = NodeSet { formed, ctx: self, valid, new_valid, announced_at: None };
        sets.push(set, outputs)
    }

    /// Hand the sets in `done` to the publishing thread, in order. With `generation`
    /// (the parameters' generation this thread applied) and unchanged parameters, a set
    /// waiting to be pushed is pushed before each hand-over when the pipeline has room
    /// beside the set being handed over. False when the thread must end.
    fn hand_over(
        &'c self,
        sets: &mut InFlight<NodeSet<'c>>,
        done: Vec<Finished<NodeSet<'c>>>,
        generation: Option<u64>,
        log: &mut RateLimitedLog,
    ) -> bool {
        let mut done = VecDeque::from(done);
        while let Some(finished) = done.pop_front() {
            let ready = match self.outcome(sets, finished, &done, log) {
                Outcome::Ready(ready) => ready,
                Outcome::Nothing => continue,
                Outcome::Stop => return false,
            };
            let same = generation.is_some_and(|g| lock(&self.shared.params).generation == g);
            if same && sets.has_room(1) {
                if let Some(formed) = self.shared.sets.try_take() {
                    self.shared.stats.overlapped.fetch_add(1, Ordering::Relaxed);
                    done.extend(self.push(sets, formed, log));
                }
            }
            if self.tx.send(*ready).is_err() {
                return false; // the publishing thread is gone (it panicked): nothing can go out
            }
        }
        true
    }

    /// What a set that left the pipeline gives: its message and what the publishing
    /// thread needs, or nothing (refused, failed: counted). `later`: the sets that left
    /// after it, not handed over yet (counted failed too when the node exits, with those
    /// still in flight).
    fn outcome(
        &self,
        sets: &InFlight<NodeSet<'c>>,
        finished: Finished<NodeSet<'c>>,
        later: &VecDeque<Finished<NodeSet<'c>>>,
        log: &mut RateLimitedLog,
    ) -> Outcome {
        let (shared, topics) = (self.shared, self.topics);
        let Finished { set, result } = finished;
        if set.announced_at.is_some()
            && !result.as_ref().is_ok_and(|(i, _)| i.gpu_failure.is_none())
        {
            // Its block was given back unpublished: a new generation withdrew it.
            log.warn(
                &shared.logger,
                "tensor_ref: a set whose TensorRef went out before its GPU work failed: withdrawn \
                 (consumers drop it; Shared withdrawn sets)",
            );
        }
        let (info, message) = match result {
            Ok(done) => done,
            Err(e @ crate::Error::GpuFailure { .. }) => {
                let unpublished: u64 =
                    sets.sets().chain(later.iter().map(|f| &f.set)).map(|s| s.new_valid).sum();
                shared.exit_fatal(e.to_string(), set.new_valid + unpublished);
                return Outcome::Stop;
            }
            Err(e) => {
                self.count_failed(&set, e, log);
                return Outcome::Nothing;
            }
        };
        let slots = slots_of(&set.formed);
        for (i, reason) in &info.rejected {
            if !slots[*i].repeated {
                reject(shared, log, topics, *i, ("", reason));
            }
        }
        if let Some(failure) = &info.gpu_failure {
            note_gpu_failure(sets.pipeline(), failure, shared);
        }
        let slots = slots
            .iter()
            .map(|s| ReadySlot {
                header: s.header.clone(),
                arrived: s.frame.map(|f| f.at),
                repeated: s.repeated,
            })
            .collect();
        let ready = Ready {
            message,
            slots,
            geometries: info.geometries,
            header: set.with_inputs(pipeline::set_header),
            times: info.times,
            backend: sets.pipeline().backend().name(),
            formed_at: set.formed.at,
            announced_at: set.announced_at,
            new_valid: set.new_valid,
        };
        Outcome::Ready(Box::new(ready))
    }
    /// A set that failed with `e` (other than the GPU failure the node exits on): a single
    /// camera's frame that the configuration refuses or a compressed frame that did not
    /// decode is rejected; else its new frames are counted failed; logged.
    fn count_failed(&self, set: &NodeSet<'c>, e: crate::Error, log: &mut RateLimitedLog) {
        let (shared, topics) = (self.shared, self.topics);
        match e {
            crate::Error::Image(e) => {
                // A single camera's frame that the configuration refuses (its roi).
                reject(shared, log, topics, 0, ("invalid image: ", &e.to_string()));
            }
            crate::Error::Decode(e) => {
                // A compressed frame whose headers were fine but whose data did not decode
                // (corrupt entropy-coded data): rejected; with a batch, the set's other
                // new frames go with it (the decoder does not say which slot), counted
                // failed with the reason.
                shared.stats.undecodable(e.kind());
                if topics.len() < 2 {
                    reject(
                        shared,
                        log,
                        topics,
                        0,
                        ("undecodable compressed image: ", &e.to_string()),
                    );
                } else {
                    let why = format!("a compressed frame of the set did not decode: {e}");
                    log.error(&shared.logger, &format!("set failed: {why}"));
                    for _ in 0..set.new_valid {
                        shared.stats.failed(why.clone());
                    }
                }
            }
            e => {
                log.error(&shared.logger, &format!("frame failed: {e}"));
                for _ in 0..set.new_valid {
                    shared.stats.failed(e.to_string());
                }
            }
        }
    }
}

/// A GPU failure the pipeline recovered from: logged, counted, and the backend as it is
/// now shown in diagnostics.
fn note_gpu_failure(pipeline: &Pipeline, failure: &GpuFailure, shared: &Shared) {
    let logger = shared.logger.as_str();
    r2r::log_error!(logger, "GPU failure: {}", failure.reason);
    r2r::log_warn!(logger, "{failure}");
    if failure.unreturned_messages > 0 {
        r2r::log_warn!(
            logger,
            "{} message(s) of the failed backend were still being published when it was \
             replaced (after waiting {} s)",
            failure.unreturned_messages,
            crate::pipeline::OUTSTANDING_WAIT.as_secs()
        );
    }
    shared.stats.gpu_failures.fetch_add(1, Ordering::Relaxed);
    let backend = pipeline.backend();
    let mut b = lock(&shared.backend);
    b.name = backend.name().to_string();
    b.device = backend.device_description();
    b.details = backend.diagnostics();
    b.gpu_failure = Some((failure.reason.clone(), failure.to_string()));
}
