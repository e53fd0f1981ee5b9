//! The frame-set former on the spin thread: every input's frames go through the batch
//! synchronizer ([`crate::transport::batch_sync::Batcher`]), which decides which frame of
//! each camera goes into the next set (`batch_policy`; a single camera is a batch of one:
//! each frame forms a set as it arrives), and each set it forms goes to the keep-latest
//! slot the processing thread takes from; a set replaced there counts its new frames as
//! dropped.
//!
//! Times given to the former are the steady clock since the node started (arrivals,
//! `batch_timeout_ms`, `stale_after_ms`: durations the node measures, like its stage
//! times); the stamps `approximate_time` compares are the image headers'.
//!
//! Accounting, per frame: received (pushed to the former) = published (in a published
//! set, counted once even when repeated) + dropped (replaced or discarded by the former,
//! in a set replaced in the slot, or waiting at shutdown) + rejected (invalid: a batch
//! slot is padded and flagged invalid, the batch goes out) + failed (the set failed).

use super::shared::{lock, Formed, Received, Shared};
use crate::config::Config;
use crate::transport::batch_sync::{Batch, BatchSettings, Batcher, Frame};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The frame-set former on the spin thread.
pub(super) struct Former {
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
    /// A former for the inputs of `cfg` (`inputs`, or the single `image`), started now.
    /// One camera forms a set of each frame as it arrives (`latest` with one camera).
    pub(super) fn new(cfg: &Config) -> Self {
        let n = cfg.input_count();
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
    pub(super) fn push(&mut self, camera: usize, r: Received, shared: &Shared) {
        // The managed node while not active: not taken, not counted (the frame is freed).
        if !shared.is_active() {
            return;
        }
        shared.stats.received.fetch_add(1, Ordering::Relaxed);
        let frame = Frame { stamp_ns: r.stamp_ns, received_ns: self.ns(r.at), data: Arc::new(r) };
        let at = frame.data.at;
        let batches = self.batcher.push(camera, frame);
        lock(&shared.cameras)[camera].last_arrival = Some(at);
        self.hand_over(batches, at, shared);
    }

    /// Time passed: stale cameras, `latest`'s timeout.
    pub(super) fn poll(&mut self, shared: &Shared) {
        let now = Instant::now();
        let batches = self.batcher.poll(self.ns(now));
        self.hand_over(batches, now, shared);
    }

    /// How long the spin loop may wait for messages before [`Former::poll`] is due.
    pub(super) fn spin_timeout(&self) -> Duration {
        let now = self.ns(Instant::now());
        match self.batcher.deadline() {
            Some(d) if d > now => {
                Duration::from_nanos(u64::try_from(d - now).unwrap_or(0)).min(SPIN_PERIOD)
            }
            Some(_) => Duration::ZERO,
            None => SPIN_PERIOD,
        }
    }

    fn hand_over(&mut self, batches: Vec<Batch<Received>>, at: Instant, shared: &Shared) {
        for batch in batches {
            if let Some(old) = shared.sets.replace(Formed { batch, at }) {
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
            // (One camera is never waited for: its staleness changes nothing.)
            if stale[i] != self.stale[i] && n >= 2 {
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
    pub(super) fn finish(&mut self, shared: &Shared) {
        let pending: u64 = (0..self.batcher.len()).map(|i| self.batcher.pending(i)).sum();
        shared.stats.dropped.fetch_add(pending, Ordering::Relaxed);
    }
}
