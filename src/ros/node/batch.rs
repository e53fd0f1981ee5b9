//! The node with two or more inputs (`inputs`): the spin thread feeds every camera's
//! frames to the batch former ([`crate::pipeline::batch_sync::Batcher`], `batch_policy`)
//! and hands each batch it forms to a keep-latest slot of batches; the processing thread
//! runs the whole batch on the backend (one `process_batch_into`) into one
//! `vision_preproc_msgs/TensorBatch`, serialized in place, and hands it to the publishing
//! thread, which publishes it with one `FrameTiming` and each item's scaled camera_info
//! while the processing thread computes the next batch into a second message buffer.
//!
//! Times given to the former are the steady clock since the node started (arrivals,
//! `batch_timeout_ms`, `stale_after_ms`: durations the node measures, like its stage
//! times); the stamps `approximate_time` compares are the image headers'.
//!
//! Accounting, per frame: received (pushed to the former) = published (in a published
//! batch, counted once even when repeated) + dropped (replaced or discarded by the
//! former, in a batch replaced in the slot, or waiting at shutdown) + rejected (invalid:
//! its slot is padded and flagged invalid, the batch goes out) + failed (the batch
//! failed).

use super::{clock, lock, native::ros_header, Outputs, RateLimitedLog, Received, Shared};
use crate::backend::StageTimes;
use crate::bag::msgs::Header;
use crate::config::Config;
use crate::pipeline::batch_sync::{Batch, BatchSettings, Batcher, CameraCounts, Frame, Item};
use crate::pipeline::{frame_timing, BatchInput, Geometry, OwnedMessage, Pipeline};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A batch handed to the processing thread, with the instant it was formed.
pub struct Formed {
    batch: Batch<Received>,
    at: Instant,
}

impl Formed {
    /// Frames of the batch not in an earlier one.
    pub fn new_frames(&self) -> u64 {
        self.batch.items.iter().filter(|i| matches!(i, Item::Frame { repeated: false, .. })).count()
            as u64
    }
}

/// What `/diagnostics` shows of one camera (written by the spin thread and, for
/// `published`, the processing thread).
#[derive(Debug, Clone, Default)]
pub struct CameraState {
    /// The image topic, resolved.
    pub topic: String,
    /// The former's counters (received = batched + dropped + pending).
    pub counts: CameraCounts,
    /// No frame for `stale_after_ms`.
    pub stale: bool,
    /// When its last frame arrived.
    pub last_arrival: Option<Instant>,
    /// Its frames in published batches (once each).
    pub published: u64,
    /// Its frames rejected as invalid.
    pub rejected: u64,
}

/// The batch former on the spin thread.
pub struct Former {
    batcher: Batcher<Received>,
    start: Instant,
    /// Sum of the former's drops already added to the node's counter.
    dropped_seen: u64,
    stale: Vec<bool>,
    stale_after: Duration,
}

/// Longest wait of the spin loop (as the single-camera node).
const SPIN_PERIOD: Duration = Duration::from_millis(20);

impl Former {
    /// A former for the cameras of `cfg.inputs`, started now.
    pub fn new(cfg: &Config) -> Self {
        let n = cfg.inputs.len();
        Former {
            batcher: Batcher::new(n, BatchSettings::of(cfg), 0),
            start: Instant::now(),
            dropped_seen: 0,
            stale: vec![false; n],
            stale_after: Duration::from_millis(u64::from(cfg.stale_after_ms)),
        }
    }

    fn ns(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(i64::MAX)
    }

    /// A frame of camera `camera` arrived.
    pub fn push(&mut self, camera: usize, r: Received, shared: &Shared) {
        shared.stats.received.fetch_add(1, Ordering::Relaxed);
        let frame =
            Frame { stamp_ns: r.msg.stamp_ns(), received_ns: self.ns(r.at), data: Arc::new(r) };
        let at = frame.data.at;
        let batches = self.batcher.push(camera, frame);
        lock(&shared.cameras)[camera].last_arrival = Some(at);
        self.hand_over(batches, shared);
    }

    /// Time passed: stale cameras, `latest`'s timeout.
    pub fn poll(&mut self, shared: &Shared) {
        let batches = self.batcher.poll(self.ns(Instant::now()));
        self.hand_over(batches, shared);
    }

    /// How long the spin loop may wait for messages before [`Former::poll`] is due.
    pub fn spin_timeout(&self) -> Duration {
        let now = self.ns(Instant::now());
        match self.batcher.deadline() {
            Some(d) if d > now => {
                Duration::from_nanos(u64::try_from(d - now).unwrap_or(0)).min(SPIN_PERIOD)
            }
            Some(_) => Duration::ZERO,
            None => SPIN_PERIOD,
        }
    }

    fn hand_over(&mut self, batches: Vec<Batch<Received>>, shared: &Shared) {
        for batch in batches {
            let formed = Formed { batch, at: Instant::now() };
            if let Some(old) = shared.batches.replace(formed) {
                shared.stats.dropped.fetch_add(old.new_frames(), Ordering::Relaxed);
            }
        }
        self.sync(shared);
    }

    /// Copy the former's counters to the node's and log cameras going stale or live.
    fn sync(&mut self, shared: &Shared) {
        let n = self.batcher.len();
        let dropped: u64 = (0..n).map(|i| self.batcher.counts(i).dropped).sum();
        shared.stats.dropped.fetch_add(dropped - self.dropped_seen, Ordering::Relaxed);
        self.dropped_seen = dropped;
        let stale = self.batcher.stale();
        let mut cams = lock(&shared.cameras);
        for (i, cam) in cams.iter_mut().enumerate() {
            cam.counts = self.batcher.counts(i);
            cam.stale = stale[i];
            if stale[i] != self.stale[i] {
                if stale[i] {
                    r2r::log_warn!(
                        &shared.logger,
                        "camera {i} ({}) is stale: no frame for {} ms; its batch slot is padded \
                         and flagged invalid until its next frame",
                        cam.topic,
                        self.stale_after.as_millis()
                    );
                } else {
                    r2r::log_info!(&shared.logger, "camera {i} ({}) is live again", cam.topic);
                }
            }
        }
        self.stale = stale;
    }

    /// At shutdown: frames still held by the former count as dropped.
    pub fn finish(&mut self, shared: &Shared) {
        let pending: u64 = (0..self.batcher.len()).map(|i| self.batcher.pending(i)).sum();
        shared.stats.dropped.fetch_add(pending, Ordering::Relaxed);
    }
}

/// A batch's slot as the processing thread sees it.
struct Slot<'a> {
    frame: Option<&'a Received>,
    repeated: bool,
    header: Header,
}

/// What the publishing thread needs of one slot of a processed batch.
struct ReadySlot {
    header: Header,
    /// When its frame arrived (`None`: padded because stale).
    arrived: Option<Instant>,
    repeated: bool,
}

/// A processed batch handed to the publishing thread.
struct Ready {
    message: OwnedMessage,
    slots: Vec<ReadySlot>,
    geometries: Vec<Option<Geometry>>,
    header: Header,
    times: StageTimes,
    backend: &'static str,
    formed_at: Instant,
    /// Its valid frames not in an earlier batch (counted failed if publishing fails).
    new_valid: u64,
}

/// The processing loop of a batching node (owns the pipeline). Publishing runs on a
/// second thread: batch k is published (the `TensorBatch`, each item's camera_info, the
/// `FrameTiming`) while batch k+1 is staged and computed into the pipeline's other
/// message buffer. The hand-over waits until the publishing thread is free, so at most
/// one batch is being published and one processed (two message buffers); batches formed
/// meanwhile replace each other in the keep-latest slot (counted as dropped).
pub fn process_loop(pipeline: Pipeline, shared: &Shared, out: Outputs) {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Ready>(0);
    std::thread::scope(|scope| {
        let publisher = std::thread::Builder::new()
            .name("publish".into())
            .spawn_scoped(scope, move || publish_loop(&rx, shared, &out));
        match publisher {
            Ok(_) => process(pipeline, shared, &tx),
            Err(e) => shared.exit_fatal(format!("starting the publishing thread: {e}"), 0),
        }
        drop(tx); // the publishing thread publishes what it has, then ends
    });
}

fn process(mut pipeline: Pipeline, shared: &Shared, tx: &SyncSender<Ready>) {
    let logger = shared.logger.as_str();
    let mut generation = 0u64;
    let mut reject_log = RateLimitedLog::new(&shared.clock);
    let topics: Vec<String> = lock(&shared.cameras).iter().map(|c| c.topic.clone()).collect();
    while let Some(formed) = shared.batches.take() {
        {
            let p = lock(&shared.params);
            if p.generation != generation {
                generation = p.generation;
                if let Err(e) = pipeline.set_config(p.config.clone()) {
                    r2r::log_error!(logger, "new parameters not applied: {e}");
                }
            }
        }
        let slots: Vec<Slot<'_>> = formed
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
            .collect();
        // Views of the frames; an invalid frame is rejected and its slot padded.
        let mut views = Vec::with_capacity(slots.len());
        for (i, s) in slots.iter().enumerate() {
            views.push(match s.frame.map(|f| f.msg.view()) {
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => {
                    if !s.repeated {
                        let reason = format!("{}: {e}", topics[i]);
                        reject_log
                            .error(logger, &format!("frame rejected: invalid image: {reason}"));
                        shared.stats.rejected(reason);
                        lock(&shared.cameras)[i].rejected += 1;
                    }
                    None
                }
                None => None,
            });
        }
        let inputs: Vec<BatchInput<'_, '_>> = slots
            .iter()
            .zip(&views)
            .enumerate()
            .map(|(i, (s, v))| BatchInput {
                topic: &topics[i],
                image: v.as_ref(),
                header: &s.header,
                source_encoding: s.frame.map_or("", |f| f.msg.encoding()),
                repeated: s.repeated,
            })
            .collect();
        // The batch's stamp: the newest of its valid items.
        let header = slots
            .iter()
            .zip(&views)
            .filter(|(_, v)| v.is_some())
            .map(|(s, _)| &s.header)
            .max_by_key(|h| (h.sec, h.nanosec))
            .map(|h| Header { sec: h.sec, nanosec: h.nanosec, frame_id: String::new() })
            .unwrap_or_default();
        let new_valid = slots
            .iter()
            .zip(&views)
            .filter(|(s, v)| s.frame.is_some() && !s.repeated && v.is_some())
            .count() as u64;
        let info = match pipeline.process_batch(&inputs, &header) {
            Ok(info) => info,
            Err(e @ crate::Error::GpuFailure { .. }) => {
                shared.exit_fatal(e.to_string(), new_valid);
                break;
            }
            Err(e) => {
                reject_log.error(logger, &format!("batch failed: {e}"));
                for _ in 0..new_valid {
                    shared.stats.failed(e.to_string());
                }
                continue;
            }
        };
        for (i, reason) in &info.rejected {
            if !slots[*i].repeated {
                let reason = format!("{}: {reason}", topics[*i]);
                reject_log.error(logger, &format!("frame rejected: {reason}"));
                shared.stats.rejected(reason);
                lock(&shared.cameras)[*i].rejected += 1;
            }
        }
        if let Some(failure) = &info.gpu_failure {
            super::note_gpu_failure(&pipeline, failure, shared);
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
            header,
            times: info.times,
            backend: pipeline.backend().name(),
            formed_at: formed.at,
            new_valid,
        };
        if tx.send(ready).is_err() {
            break; // the publishing thread is gone (it panicked): nothing can go out
        }
    }
}

/// The publishing thread of a batching node: each processed batch's `TensorBatch` (with
/// the items' ages at publish time), camera_info per item and `FrameTiming`.
fn publish_loop(rx: &Receiver<Ready>, shared: &Shared, out: &Outputs) {
    let logger = shared.logger.as_str();
    let mut sequence = 0u64;
    let mut dropped_reported = 0u64;
    let mut error_log = RateLimitedLog::new(&shared.clock);
    for mut ready in rx {
        let now = shared.clock.now();
        let ages: Vec<f32> =
            ready.slots.iter().map(|s| clock::age_us(now, &ros_header(&s.header).stamp)).collect();
        if let Err(e) = ready.message.set_batch_ages(&ages) {
            r2r::log_warn!(logger, "TensorBatch ages: {e}");
        }
        let published = out.tensor.publish_raw(ready.message.bytes());
        drop(ready.message); // the buffer goes back to the pipeline for the next batch
        if let Err(e) = published {
            error_log.error(logger, &format!("publishing tensor: {e}"));
            for _ in 0..ready.new_valid {
                shared.stats.failed(format!("publishing tensor: {e}"));
            }
            continue;
        }
        shared.batches_published.fetch_add(1, Ordering::Relaxed);
        for (i, g) in ready.geometries.iter().enumerate() {
            let (Some(g), Some(publisher)) = (g, out.batch_camera_info.get(i)) else {
                continue;
            };
            if let Some(info_msg) = lock(&shared.camera_infos[i]).as_ref() {
                let scaled =
                    super::scaled_camera_info(info_msg, g, &ros_header(&ready.slots[i].header));
                if let Err(e) = publisher.publish(&scaled) {
                    r2r::log_warn!(logger, "publishing camera_info of batch item {i}: {e}");
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
        let timing = frame_timing(
            &ready.header,
            sequence,
            ready.backend,
            &ready.times,
            ready.formed_at.elapsed().as_secs_f32() * 1e6,
            oldest_age,
            u32::try_from(dropped.saturating_sub(dropped_reported)).unwrap_or(u32::MAX),
        );
        dropped_reported = dropped;
        if let Err(e) = out.timing.publish_raw(&timing.encode()) {
            r2r::log_warn!(logger, "publishing timing: {e}");
        }
        sequence += 1;
    }
}
