//! The processing and publishing threads, the same for one camera and for N. The
//! processing thread owns the pipeline (and so the backend and its streams): it takes the
//! newest formed set, runs it (`Pipeline::process_frames`: a `Tensor` for one input, a
//! `TensorBatch` for 2+, serialized in place) and hands the message to the publishing
//! thread, which publishes it with the scaled camera_info of each item, one
//! `FrameTiming` and, when someone watches, `debug_image`, while the processing thread
//! computes the next set into a second message buffer. The hand-over waits until the
//! publishing thread is free, so at most one set is being published and one processed;
//! sets formed meanwhile replace each other in the keep-latest slot (counted as dropped).

use super::clock::{self, Throttle};
use super::handoff::{Handoff, SetOutputs};
use super::native::ros_header;
use super::shared::Formed;
use super::shared::{lock, Outputs, RateLimitedLog, Received, Shared};
use crate::backend::StageTimes;
use crate::image::ImageView;
use crate::pipeline::{
    frame_timing, set_header, slot_reason, FrameInput, Geometry, GpuFailure, OwnedMessage, Pipeline,
};
use crate::transport::batch_sync::Item;
use crate::wire::msgs::{FrameTiming, Header, OUTPUT_TENSOR, OUTPUT_TENSOR_REF};
use r2r::sensor_msgs::msg::{CameraInfo, Image, RegionOfInterest};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::{Duration, Instant};

/// One input of a formed set as the processing thread sees it.
struct Slot<'a> {
    frame: Option<&'a Received>,
    repeated: bool,
    header: Header,
}

/// What the publishing thread needs of one item of a processed set.
struct ReadySlot {
    header: Header,
    /// When its frame arrived (`None`: padded because stale).
    arrived: Option<Instant>,
    repeated: bool,
}

/// A processed set handed to the publishing thread.
struct Ready {
    message: OwnedMessage,
    slots: Vec<ReadySlot>,
    geometries: Vec<Option<Geometry>>,
    header: Header,
    times: StageTimes,
    backend: &'static str,
    formed_at: Instant,
    /// When its `TensorRef` went out, if before its work ended ([`Pipeline::announce`]).
    announced_at: Option<Instant>,
    /// Its valid frames not in an earlier set (counted failed if publishing fails).
    new_valid: u64,
}

/// Run the node's processing (this thread) and publishing (a second thread) until the
/// node stops.
pub fn process_loop(pipeline: Pipeline, shared: &Shared, out: Outputs, handoff: Option<Handoff>) {
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

/// A formed set submitted to the pipeline and not finished yet.
struct Submitted {
    formed: Formed,
    /// Its valid frames not in an earlier set (counted failed if it fails).
    new_valid: u64,
    /// When its `TensorRef` went out, if it did already.
    announced_at: Option<Instant>,
}

/// Each item's age now on the node's clock (`TensorBatch`'s and `TensorRef`'s items).
fn ages<'h>(shared: &Shared, headers: impl Iterator<Item = &'h Header>) -> Vec<f32> {
    let now = shared.clock.now();
    headers.map(|h| clock::age_us(now, &ros_header(h).stamp)).collect()
}

/// The processing thread: takes the newest formed set and submits it, finishes it and
/// hands it to the publishing thread. With a backend that keeps two sets in flight
/// (CUDA), a set that is waiting when the previous one is finished is submitted before
/// that one is handed over (the hand-over waits for the publishing thread), so that its
/// staging, upload and GPU work overlap the previous set's publishing; one waiting right
/// after a submission is submitted too. A set is never waited for while another is in
/// flight: at camera rate each set is finished right after its submission, as before.
fn process(
    mut pipeline: Pipeline,
    shared: &Shared,
    tx: &SyncSender<Ready>,
    handoff: Option<Handoff>,
) {
    let mut generation = 0u64;
    let mut log = RateLimitedLog::new(&shared.clock);
    let topics: Vec<String> = lock(&shared.cameras).iter().map(|c| c.topic.clone()).collect();
    let mut queue: VecDeque<Submitted> = VecDeque::new();
    let ctx = Context { shared, topics: &topics, tx, handoff: handoff.map(RefCell::new) };
    // Submit the sets waiting now while fewer than the backend's sets are in flight,
    // `holding` counting a finished set not handed over yet (its buffer is still ours:
    // with one set in flight, as on the CPU, nothing is submitted before the hand-over).
    let overlap =
        |pipeline: &mut Pipeline, queue: &mut VecDeque<Submitted>, holding, log: &mut _| {
            while queue.len() + holding < pipeline.max_in_flight() {
                let Some(formed) = shared.sets.try_take() else { break };
                if let Some(sub) = ctx.submit(pipeline, formed, log) {
                    shared.stats.overlapped.fetch_add(1, Ordering::Relaxed);
                    queue.push_back(sub);
                }
            }
        };
    loop {
        // Parameters set at run time apply from the next set submitted (validated when
        // set), after the sets in flight are finished with the old ones.
        if lock(&shared.params).generation != generation {
            while let Some(sub) = queue.pop_front() {
                if !ctx.finish_and_hand_over(&mut pipeline, sub, &mut queue, &mut log) {
                    return;
                }
            }
            apply_params(&mut pipeline, shared, &mut generation);
        }
        if queue.is_empty() {
            let Some(formed) = shared.sets.take() else { break };
            // Set while this thread waited for the set: nothing is in flight.
            apply_params(&mut pipeline, shared, &mut generation);
            queue.extend(ctx.submit(&mut pipeline, formed, &mut log));
            overlap(&mut pipeline, &mut queue, 0, &mut log);
        }
        let Some(sub) = queue.pop_front() else { continue };
        let ready = match ctx.finish(&mut pipeline, sub, &mut queue, &mut log) {
            Finished::Ready(ready) => *ready,
            Finished::Nothing => continue,
            Finished::Stop => return,
        };
        if lock(&shared.params).generation == generation {
            overlap(&mut pipeline, &mut queue, 1, &mut log);
        }
        if tx.send(ready).is_err() {
            return; // the publishing thread is gone (it panicked): nothing can go out
        }
    }
    // Stopped: what is in flight is finished and handed over (the publishing thread
    // publishes it before it ends).
    while let Some(sub) = queue.pop_front() {
        if !ctx.finish_and_hand_over(&mut pipeline, sub, &mut queue, &mut log) {
            return;
        }
    }
}

/// Apply the parameters set at run time (validated when set) when their generation is
/// not `generation` (then updated); call with no set in flight.
fn apply_params(pipeline: &mut Pipeline, shared: &Shared, generation: &mut u64) {
    let p = lock(&shared.params);
    if p.generation == *generation {
        return;
    }
    *generation = p.generation;
    if let Err(e) = pipeline.set_config(p.config.clone()) {
        r2r::log_error!(shared.logger.as_str(), "new parameters not applied: {e}");
    }
}

/// What finishing a set gave.
enum Finished {
    /// The set, for the publishing thread.
    Ready(Box<Ready>),
    /// Nothing to publish (the set failed: counted).
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
                header: frame.data.msg.header(),
            },
            Item::Stale => Slot { frame: None, repeated: false, header: Header::default() },
        })
        .collect()
}

/// The pipeline's inputs of `slots` with their `views` (`None`: no frame, or invalid).
fn inputs_of<'a, 'b>(
    slots: &'b [Slot<'a>],
    views: &'b [Option<ImageView<'a>>],
    topics: &'b [String],
) -> Vec<FrameInput<'a, 'b>> {
    slots
        .iter()
        .zip(views)
        .enumerate()
        .map(|(i, (s, v))| FrameInput {
            topic: &topics[i],
            image: v.as_ref(),
            header: &s.header,
            source_encoding: s.frame.map_or("", |f| f.msg.encoding()),
            repeated: s.repeated,
        })
        .collect()
}

impl Context<'_> {
    /// Submit a formed set; `None` when nothing was queued (its frame refused, or the
    /// set failed: counted).
    fn submit(
        &self,
        pipeline: &mut Pipeline,
        formed: Formed,
        log: &mut RateLimitedLog,
    ) -> Option<Submitted> {
        let new_valid = self.submit_set(pipeline, &formed, log)?;
        let announced_at = self.announce(pipeline, &formed);
        Some(Submitted { formed, new_valid, announced_at })
    }

    /// A set just submitted into a shared block with an interprocess event (CUDA): its
    /// `TensorRef` goes out now, before its GPU work ends (consumers wait for the
    /// event), with each item's age now. When it went out.
    fn announce(&self, pipeline: &mut Pipeline, formed: &Formed) -> Option<Instant> {
        let handoff = self.handoff.as_ref()?;
        let ages = ages(self.shared, slots_of(formed).iter().map(|s| &s.header));
        let sent = pipeline.announce(&ages, |cdr| handoff.borrow_mut().announce(cdr, self.shared));
        sent.then(Instant::now)
    }

    /// [`Context::submit`]'s work: the set's new valid frames when it was queued.
    fn submit_set(
        &self,
        pipeline: &mut Pipeline,
        formed: &Formed,
        log: &mut RateLimitedLog,
    ) -> Option<u64> {
        let (shared, topics) = (self.shared, self.topics);
        let slots = slots_of(formed);
        // Views of the frames; an invalid frame is rejected (a batch slot is padded).
        let mut views = Vec::with_capacity(slots.len());
        for (i, s) in slots.iter().enumerate() {
            views.push(match s.frame.map(|f| f.msg.view()) {
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => {
                    if !s.repeated {
                        reject(shared, log, topics, i, ("invalid image: ", &e.to_string()));
                    }
                    None
                }
                None => None,
            });
        }
        let valid: Vec<bool> = views.iter().map(Option::is_some).collect();
        if topics.len() < 2 && !valid[0] {
            return None; // a single camera's invalid frame: nothing to publish
        }
        let new_valid = slots.iter().zip(&valid).filter(|(s, &v)| v && !s.repeated).count() as u64;
        let (block, fill) =
            match self.handoff.as_ref().map(|h| h.borrow_mut().outputs(pipeline, shared)) {
                None => (None, true),
                Some(SetOutputs::Go { block, fill }) => (block, fill),
                Some(SetOutputs::NoBlock) => {
                    // Only tensor_ref is wanted and its consumers hold every block.
                    shared.stats.dropped.fetch_add(new_valid, Ordering::Relaxed);
                    shared.stats.dropped_no_block.fetch_add(new_valid, Ordering::Relaxed);
                    return None;
                }
            };
        let inputs = inputs_of(&slots, &views, topics);
        match pipeline.submit_frames_to(&inputs, &set_header(&inputs), block, fill) {
            Ok(()) => {}
            Err(crate::Error::Image(e)) => {
                // A single camera's frame that the configuration refuses (its roi).
                reject(shared, log, topics, 0, ("invalid image: ", &e.to_string()));
                return None;
            }
            Err(e) => {
                log.error(&shared.logger, &format!("frame failed: {e}"));
                for _ in 0..new_valid {
                    shared.stats.failed(e.to_string());
                }
                return None;
            }
        }
        Some(new_valid)
    }

    /// [`Context::finish`], then hand the set over; false when the thread must end.
    fn finish_and_hand_over(
        &self,
        pipeline: &mut Pipeline,
        sub: Submitted,
        queue: &mut VecDeque<Submitted>,
        log: &mut RateLimitedLog,
    ) -> bool {
        match self.finish(pipeline, sub, queue, log) {
            Finished::Ready(ready) => self.tx.send(*ready).is_ok(),
            Finished::Nothing => true,
            Finished::Stop => false,
        }
    }

    /// Finish the oldest submitted set. `queue`: the sets still in flight after it
    /// (counted failed too when the node exits).
    fn finish(
        &self,
        pipeline: &mut Pipeline,
        sub: Submitted,
        queue: &mut VecDeque<Submitted>,
        log: &mut RateLimitedLog,
    ) -> Finished {
        let (shared, topics) = (self.shared, self.topics);
        let slots = slots_of(&sub.formed);
        // The views submitted (the frames were checked then).
        let views: Vec<Option<ImageView<'_>>> =
            slots.iter().map(|s| s.frame.and_then(|f| f.msg.view().ok())).collect();
        let inputs = inputs_of(&slots, &views, topics);
        let result = pipeline.finish_frames(&inputs);
        if sub.announced_at.is_some() && !result.as_ref().is_ok_and(|i| i.gpu_failure.is_none()) {
            // Its block was given back unpublished: a new generation withdrew it.
            log.warn(
                &shared.logger,
                "tensor_ref: a set whose TensorRef went out before its GPU work failed: withdrawn \
                 (consumers drop it; Shared withdrawn sets)",
            );
        }
        let info = match result {
            Ok(info) => info,
            Err(e @ crate::Error::GpuFailure { .. }) => {
                let in_flight: u64 = queue.drain(..).map(|s| s.new_valid).sum();
                shared.exit_fatal(e.to_string(), sub.new_valid + in_flight);
                return Finished::Stop;
            }
            Err(e) => {
                log.error(&shared.logger, &format!("frame failed: {e}"));
                for _ in 0..sub.new_valid {
                    shared.stats.failed(e.to_string());
                }
                return Finished::Nothing;
            }
        };
        for (i, reason) in &info.rejected {
            if !slots[*i].repeated {
                reject(shared, log, topics, *i, ("", reason));
            }
        }
        if let Some(failure) = &info.gpu_failure {
            note_gpu_failure(pipeline, failure, shared);
        }
        let ready = Ready {
            message: pipeline.take_message(),
            slots: slots
                .iter()
                .map(|s| ReadySlot {
                    header: s.header.clone(),
                    arrived: s.frame.map(|f| f.at),
                    repeated: s.repeated,
                })
                .collect(),
            geometries: info.geometries,
            header: set_header(&inputs),
            times: info.times,
            backend: pipeline.backend().name(),
            formed_at: sub.formed.at,
            announced_at: sub.announced_at,
            new_valid: sub.new_valid,
        };
        Finished::Ready(Box::new(ready))
    }
}

/// The publishing thread: each processed set's message (with a batch's ages at publish
/// time), camera_info per item, `FrameTiming` and `debug_image`.
fn publish_loop(rx: &Receiver<Ready>, shared: &Shared, out: &Outputs) {
    let logger = shared.logger.as_str();
    let mut sequence = 0u64;
    let mut dropped_reported = 0u64;
    let mut error_log = RateLimitedLog::new(&shared.clock);
    let mut debug_throttle = Throttle::new(Duration::ZERO);
    for mut ready in rx {
        let _range = crate::nvtx::stage(crate::nvtx::Stage::Publish);
        let ages = ages(shared, ready.slots.iter().map(|s| &s.header));
        if let Err(e) = ready.message.set_ages(&ages) {
            r2r::log_warn!(logger, "TensorBatch ages: {e}");
        }
        // The descriptor first (small: consumers of the shared block get it sooner),
        // unless it went out already, before the set's GPU work ended.
        let mut outputs = if ready.message.announced() { OUTPUT_TENSOR_REF } else { 0 };
        if let Some(cdr) = ready.message.tensor_ref(&ages) {
            match out.tensor_ref.publish_raw(&cdr) {
                Ok(()) => outputs |= OUTPUT_TENSOR_REF,
                Err(e) => error_log.error(logger, &format!("publishing tensor_ref: {e}")),
            }
        }
        if ready.message.has_bytes() {
            match out.tensor.publish_raw(ready.message.bytes()) {
                Ok(()) => outputs |= OUTPUT_TENSOR,
                Err(e) => error_log.error(logger, &format!("publishing tensor: {e}")),
            }
        }
        if outputs == 0 {
            for _ in 0..ready.new_valid {
                shared.stats.failed("publishing tensor and tensor_ref failed".into());
            }
            continue;
        }
        shared.sets_published.fetch_add(1, Ordering::Relaxed);
        for (i, g) in ready.geometries.iter().enumerate() {
            let (Some(g), Some(publisher)) = (g, out.camera_info.get(i)) else {
                continue;
            };
            if let Some(info_msg) = lock(&shared.camera_infos[i]).as_ref() {
                let scaled = scaled_camera_info(info_msg, g, &ros_header(&ready.slots[i].header));
                if let Err(e) = publisher.publish(&scaled) {
                    r2r::log_warn!(logger, "publishing camera_info of input {i}: {e}");
                }
            }
        }
        let mut oldest_age = 0.0f32;
        {
            let mut cams = lock(&shared.cameras);
            for (i, (s, g)) in ready.slots.iter().zip(&ready.geometries).enumerate() {
                let (Some(arrived), Some(_)) = (s.arrived, g) else {
                    continue;
                };
                oldest_age = oldest_age.max(ages[i]);
                if !s.repeated {
                    shared.stats.published(arrived.elapsed().as_secs_f32() * 1e3);
                    cams[i].published += 1;
                }
            }
        }
        let dropped = shared.stats.dropped.load(Ordering::Relaxed);
        // Until its outputs went out: the `TensorRef` alone when it was announced and
        // no `tensor` was published.
        let handed_over = match ready.announced_at {
            Some(at) if outputs & OUTPUT_TENSOR == 0 => at,
            _ => Instant::now(),
        };
        let timing = frame_timing(
            &ready.header,
            sequence,
            ready.backend,
            &ready.times,
            handed_over.saturating_duration_since(ready.formed_at).as_secs_f32() * 1e6,
            oldest_age,
            u32::try_from(dropped.saturating_sub(dropped_reported)).unwrap_or(u32::MAX),
        );
        let timing = FrameTiming { outputs, ..timing };
        dropped_reported = dropped;
        if let Err(e) = out.timing.publish_raw(&timing.encode()) {
            r2r::log_warn!(logger, "publishing timing: {e}");
        }
        sequence += 1;
        // After the timing, so that total_us does not count it (it is made only while
        // someone watches).
        let stamp = ros_header(&ready.header);
        publish_debug_image(&ready.message, &stamp, &out.debug_image, &mut debug_throttle, shared);
        // Its descriptor is out: the block is reusable once no consumer holds it.
        if let (Some(block), true) = (ready.message.take_block(), outputs & OUTPUT_TENSOR_REF != 0)
        {
            block.published();
        }
        // The message's buffer goes back to the pipeline when `ready` is dropped here.
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

/// `debug_image`: what the network sees, de-normalized to rgb8 (grey tensors as mono8; a
/// batch's items stacked top to bottom), computed only while someone subscribes and at
/// most `debug_image_rate` times a second of the node's clock.
fn publish_debug_image(
    message: &OwnedMessage,
    header: &r2r::std_msgs::msg::Header,
    publisher: &r2r::Publisher<Image>,
    throttle: &mut Throttle,
    shared: &Shared,
) {
    let logger = shared.logger.as_str();
    let rate = lock(&shared.params).config.debug_image_rate;
    if rate <= 0.0 || publisher.get_inter_process_subscription_count().unwrap_or(0) == 0 {
        return;
    }
    throttle.set_period(Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::MAX));
    if !throttle.ready(shared.clock.now()) {
        return;
    }
    let preview = match message.preview() {
        Ok(p) => p,
        Err(e) => {
            r2r::log_warn!(logger, "debug_image: {e}");
            return;
        }
    };
    let msg = Image {
        header: header.clone(),
        height: preview.height,
        width: preview.width,
        encoding: if preview.channels == 3 { "rgb8" } else { "mono8" }.to_string(),
        is_bigendian: 0,
        step: preview.width * preview.channels,
        data: preview.data,
    };
    if let Err(e) = publisher.publish(&msg) {
        r2r::log_warn!(logger, "publishing debug_image: {e}");
    }
}

/// The camera_info of the network image: the source's, scaled and offset exactly like
/// the image (see [`Geometry::scale_intrinsics`]), stamped like the tensor.
fn scaled_camera_info(
    src: &CameraInfo,
    g: &Geometry,
    image: &r2r::std_msgs::msg::Header,
) -> CameraInfo {
    let mut out = src.clone();
    out.header = image.clone();
    if !src.header.frame_id.is_empty() {
        out.header.frame_id = src.header.frame_id.clone();
    }
    out.width = g.network_width;
    out.height = g.network_height;
    let mut k = [0.0; 9];
    let mut p = [0.0; 12];
    let kn = src.k.len().min(9);
    let pn = src.p.len().min(12);
    k[..kn].copy_from_slice(&src.k[..kn]);
    p[..pn].copy_from_slice(&src.p[..pn]);
    g.scale_intrinsics(&mut k, &mut p);
    out.k = k.to_vec();
    out.p = p.to_vec();
    // The network image is the whole output: no further binning or roi applies.
    out.binning_x = 0;
    out.binning_y = 0;
    out.roi = RegionOfInterest::default();
    out
}
