//! Multi-camera batching: which frame of each camera goes into the next batch. Pure (no
//! ROS, no clock of its own): the node feeds it each arrival and the time, and processes
//! the batches it hands out. Times are nanoseconds: `now` and `received_ns` on the node's
//! clock, `stamp_ns` from each image header.
//!
//! Two policies (`batch_policy`):
//! - [`BatchPolicy::Latest`]: a batch is formed when every live camera has a frame newer
//!   than the last batch, or when `batch_timeout` has passed since the first such frame;
//!   each item is the camera's newest frame (a camera without a new one repeats its last,
//!   flagged `repeated`).
//! - [`BatchPolicy::ApproximateTime`]: the sets of message_filters' ApproximateTime policy
//!   (C++, age penalty 0.1, no inter-message lower bound), over header stamps, with
//!   `max_interval` as the largest stamp spread of a set and `queue_size` frames kept per
//!   camera. Its properties (as documented for message_filters): every frame is used at
//!   most once; sets never cross (on every camera, the frames of a later set are later);
//!   a frame is dropped only when no set can use it; a set is output as soon as no later
//!   frame can make a better (smaller-spread) set containing its pivot.
//!
//! Staleness, for both: a camera whose last frame arrived more than `stale_after` ago (or
//! that never sent one, counted from the batcher's start) is *stale*: batches do not wait
//! for it, and its item is [`Item::Stale`] (the node fills the slot with the pad value and
//! flags it invalid), so the batch keeps its shape. Its next frame makes it live again.
//!
//! Accounting: every frame pushed ends in exactly one of `batched` (it went into a batch,
//! counted once even when repeated later) or `dropped` (replaced before a batch took it,
//! dropped by the synchroniser, or discarded when its camera went stale), per camera.

use std::collections::VecDeque;
use std::sync::Arc;

/// Nanoseconds.
pub(crate) type Nanos = i64;

/// How batches are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchPolicy {
    /// Newest frame of every camera, when all live cameras have a new one or on timeout.
    Latest,
    /// message_filters ApproximateTime over header stamps.
    ApproximateTime,
}

/// Settings of a [`Batcher`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// The policy.
    pub policy: BatchPolicy,
    /// `Latest`: longest wait after the first new frame before a batch is formed anyway.
    pub batch_timeout: Nanos,
    /// `ApproximateTime`: largest spread of header stamps within a set.
    pub max_interval: Nanos,
    /// A camera whose last frame arrived longer ago than this is stale.
    pub stale_after: Nanos,
    /// `ApproximateTime`: frames kept per camera while looking for a set (>= 1).
    pub queue_size: usize,
}

impl BatchSettings {
    /// The settings of a configuration's `batch_policy`, `batch_timeout_ms`,
    /// `max_interval_ms`, `stale_after_ms` and `batch_queue_size`. One input (a
    /// configuration that is not a batch) is `Latest` whatever `batch_policy` says: each
    /// frame forms a set of one as it arrives.
    pub fn of(cfg: &crate::config::Config) -> Self {
        use crate::config::BatchPolicyChoice as C;
        let ms = |v: u32| i64::from(v) * 1_000_000;
        BatchSettings {
            policy: match cfg.batch_policy {
                _ if !cfg.is_batch() => BatchPolicy::Latest,
                C::Latest => BatchPolicy::Latest,
                C::ApproximateTime => BatchPolicy::ApproximateTime,
            },
            batch_timeout: ms(cfg.batch_timeout_ms),
            max_interval: ms(cfg.max_interval_ms),
            stale_after: ms(cfg.stale_after_ms),
            queue_size: cfg.batch_queue_size as usize,
        }
    }
}

/// The age penalty of message_filters' ApproximateTime (its default): how much more a
/// later candidate set must improve on the spread to replace an earlier one.
pub(crate) const AGE_PENALTY: f64 = 0.1;

/// One frame of one camera.
#[derive(Debug)]
pub struct Frame<T> {
    /// Header stamp.
    pub stamp_ns: Nanos,
    /// Arrival on the node's clock.
    pub received_ns: Nanos,
    /// The message.
    pub data: Arc<T>,
}

impl<T> Clone for Frame<T> {
    fn clone(&self) -> Self {
        Frame { stamp_ns: self.stamp_ns, received_ns: self.received_ns, data: self.data.clone() }
    }
}

/// One slot of a batch.
#[derive(Debug, Clone)]
pub enum Item<T> {
    /// A frame; `repeated` when it was already in an earlier batch (`Latest` only).
    Frame {
        /// The frame.
        frame: Frame<T>,
        /// Already in an earlier batch.
        repeated: bool,
    },
    /// The camera is stale: pad the slot and flag it invalid.
    Stale,
}

impl<T> Item<T> {
    /// The frame, if the slot has one.
    pub fn frame(&self) -> Option<&Frame<T>> {
        match self {
            Item::Frame { frame, .. } => Some(frame),
            Item::Stale => None,
        }
    }
}

/// A batch: one item per camera, in camera order.
#[derive(Debug, Clone)]
pub struct Batch<T> {
    /// Items, index = camera.
    pub items: Vec<Item<T>>,
}

/// Per-camera counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CameraCounts {
    /// Frames pushed.
    pub received: u64,
    /// Frames that went into a batch (once each).
    pub batched: u64,
    /// Frames that never will: replaced, dropped by the synchroniser, or discarded.
    pub dropped: u64,
}

struct Camera<T> {
    /// Arrival time of the last frame (or the batcher's start).
    last_arrival: Nanos,
    stale: bool,
    counts: CameraCounts,
    /// `Latest`: the newest frame and whether a batch has taken it.
    newest: Option<(Frame<T>, bool)>,
}

/// Forms batches from the frames of `n` cameras.
pub struct Batcher<T> {
    settings: BatchSettings,
    cameras: Vec<Camera<T>>,
    /// `Latest`: arrival of the first frame not yet in a batch.
    first_new: Option<Nanos>,
    approx: Approx<T>,
}

impl<T> Batcher<T> {
    /// A batcher for `n` cameras, started at `now`.
    pub fn new(n: usize, settings: BatchSettings, now: Nanos) -> Self {
        let cameras = (0..n)
            .map(|_| Camera {
                last_arrival: now,
                stale: false,
                counts: CameraCounts::default(),
                newest: None,
            })
            .collect();
        Batcher { settings, cameras, first_new: None, approx: Approx::new(n, settings) }
    }

    /// Number of cameras.
    pub fn len(&self) -> usize {
        self.cameras.len()
    }

    /// True with no cameras.
    pub fn is_empty(&self) -> bool {
        self.cameras.is_empty()
    }

    /// The settings.
    pub fn settings(&self) -> &BatchSettings {
        &self.settings
    }

    /// Counters of camera `i`.
    pub fn counts(&self, i: usize) -> CameraCounts {
        self.cameras[i].counts
    }

    /// Frames of camera `i` held, not yet batched nor dropped (`received = batched +
    /// dropped + pending`).
    pub fn pending(&self, i: usize) -> u64 {
        match self.settings.policy {
            BatchPolicy::Latest => u64::from(matches!(self.cameras[i].newest, Some((_, false)))),
            BatchPolicy::ApproximateTime => {
                (self.approx.queues[i].len() + self.approx.past[i].len()) as u64
            }
        }
    }

    /// Which cameras are stale (as of the last `push` or `poll`).
    pub fn stale(&self) -> Vec<bool> {
        self.cameras.iter().map(|c| c.stale).collect()
    }

    /// A frame of camera `camera` arrived (at `frame.received_ns`, which is also "now").
    /// Returns the batches it completes, oldest first (at most one for `Latest`).
    pub fn push(&mut self, camera: usize, frame: Frame<T>) -> Vec<Batch<T>> {
        let now = frame.received_ns;
        let mut out = self.update_staleness(now);
        let cam = &mut self.cameras[camera];
        cam.counts.received += 1;
        cam.last_arrival = now;
        let revived = std::mem::replace(&mut cam.stale, false);
        match self.settings.policy {
            BatchPolicy::Latest => {
                if let Some((_, false)) = cam.newest.replace((frame, false)) {
                    cam.counts.dropped += 1;
                }
                self.first_new.get_or_insert(now);
                out.extend(self.latest_batch(now));
            }
            BatchPolicy::ApproximateTime => {
                let live = self.live();
                if revived {
                    self.approx.reset();
                }
                out.extend(self.approx.push(camera, frame, &live, &mut self.cameras));
            }
        }
        out
    }

    /// Time passed: stale cameras, and a `Latest` batch whose timeout has come.
    pub fn poll(&mut self, now: Nanos) -> Vec<Batch<T>> {
        let mut out = self.update_staleness(now);
        if self.settings.policy == BatchPolicy::Latest {
            out.extend(self.latest_batch(now));
        }
        out
    }

    /// When `poll` should be called next (a timeout or a camera going stale), if ever.
    pub fn deadline(&self) -> Option<Nanos> {
        let stale = self
            .cameras
            .iter()
            .filter(|c| !c.stale)
            .map(|c| c.last_arrival.saturating_add(self.settings.stale_after))
            .min();
        let timeout = match self.settings.policy {
            BatchPolicy::Latest => {
                self.first_new.map(|t| t.saturating_add(self.settings.batch_timeout))
            }
            BatchPolicy::ApproximateTime => None,
        };
        match (stale, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn live(&self) -> Vec<bool> {
        self.cameras.iter().map(|c| !c.stale).collect()
    }

    /// Mark cameras stale whose last frame is older than `stale_after`; a change of the
    /// live set restarts the ApproximateTime search over the cameras still live.
    fn update_staleness(&mut self, now: Nanos) -> Vec<Batch<T>> {
        let mut changed = false;
        for cam in &mut self.cameras {
            if !cam.stale && now.saturating_sub(cam.last_arrival) > self.settings.stale_after {
                cam.stale = true;
                changed = true;
                if let Some((_, false)) = cam.newest.take() {
                    cam.counts.dropped += 1;
                }
            }
        }
        if !changed {
            return Vec::new();
        }
        match self.settings.policy {
            // A camera going stale may be the one the others were waiting for.
            BatchPolicy::Latest => {
                if self.cameras.iter().all(|c| !matches!(c.newest, Some((_, false)))) {
                    self.first_new = None;
                }
                self.latest_batch(now).into_iter().collect()
            }
            BatchPolicy::ApproximateTime => {
                let live = self.live();
                self.approx.drop_stale(&live, &mut self.cameras);
                self.approx.reset();
                self.approx.process(&live, &mut self.cameras)
            }
        }
    }

    /// `Latest`: the batch, if every live camera has a new frame or the timeout passed.
    fn latest_batch(&mut self, now: Nanos) -> Option<Batch<T>> {
        let first = self.first_new?;
        let all_new =
            self.cameras.iter().filter(|c| !c.stale).all(|c| matches!(c.newest, Some((_, false))));
        if !all_new && now.saturating_sub(first) < self.settings.batch_timeout {
            return None;
        }
        self.first_new = None;
        let items = self
            .cameras
            .iter_mut()
            .map(|cam| match (&mut cam.newest, cam.stale) {
                (Some((frame, taken)), false) => {
                    let repeated = std::mem::replace(taken, true);
                    if !repeated {
                        cam.counts.batched += 1;
                    }
                    Item::Frame { frame: frame.clone(), repeated }
                }
                _ => Item::Stale,
            })
            .collect();
        Some(Batch { items })
    }
}

/// The ApproximateTime search (message_filters' algorithm, restated): per camera a queue
/// of frames not yet passed over, and the frames passed over while improving the current
/// candidate (`past`); the candidate set with its stamp span and its pivot (the camera of
/// its latest frame).
struct Approx<T> {
    settings: BatchSettings,
    queues: Vec<VecDeque<Frame<T>>>,
    past: Vec<Vec<Frame<T>>>,
    candidate: Option<Candidate<T>>,
    /// The camera whose front frame was last dropped for lack of room; a set ending at
    /// that camera is not started until another camera's frame moves.
    had_drop: Vec<bool>,
}

struct Candidate<T> {
    /// One frame per live camera (`None` for stale ones).
    frames: Vec<Option<Frame<T>>>,
    /// Earliest and latest stamp of the set.
    start: Nanos,
    end: Nanos,
    /// The camera whose frame ended the first candidate of this search, and its stamp:
    /// the set is output once that frame has been passed over or no later frame can do
    /// better.
    pivot: usize,
    pivot_time: Nanos,
}

/// The earliest (ties: first camera) and latest (ties: last camera) of `times`, over the
/// live cameras: ((index, time) of the start, (index, time) of the end).
fn bounds(times: impl Iterator<Item = (usize, Nanos)>) -> Option<((usize, Nanos), (usize, Nanos))> {
    let mut out: Option<((usize, Nanos), (usize, Nanos))> = None;
    for (i, t) in times {
        out = Some(match out {
            None => ((i, t), (i, t)),
            Some((s, e)) => (if t < s.1 { (i, t) } else { s }, if t >= e.1 { (i, t) } else { e }),
        });
    }
    out
}

impl<T> Approx<T> {
    fn new(n: usize, settings: BatchSettings) -> Self {
        Approx {
            settings,
            queues: (0..n).map(|_| VecDeque::new()).collect(),
            past: (0..n).map(|_| Vec::new()).collect(),
            candidate: None,
            had_drop: vec![false; n],
        }
    }

    /// `a * (1 + AGE_PENALTY) >= b` on spans in nanoseconds.
    fn no_better(a: Nanos, b: Nanos) -> bool {
        a as f64 * (1.0 + AGE_PENALTY) >= b as f64
    }

    fn all_ready(&self, live: &[bool]) -> bool {
        live.iter().any(|&l| l) && self.queues.iter().zip(live).all(|(q, &l)| !l || !q.is_empty())
    }

    fn push(
        &mut self,
        camera: usize,
        frame: Frame<T>,
        live: &[bool],
        cams: &mut [Camera<T>],
    ) -> Vec<Batch<T>> {
        self.queues[camera].push_back(frame);
        let mut out = Vec::new();
        if self.all_ready(live) {
            out = self.process(live, cams);
        }
        if self.queues[camera].len() + self.past[camera].len() > self.settings.queue_size {
            // No room: put everything passed over back, drop this camera's oldest frame,
            // and search again from scratch.
            self.restore_past();
            if self.queues[camera].pop_front().is_some() {
                cams[camera].counts.dropped += 1;
            }
            self.had_drop[camera] = true;
            if self.candidate.take().is_some() {
                out.extend(self.process(live, cams));
            }
        }
        out
    }

    /// Forget the candidate and put the frames passed over back (the live set changed).
    fn reset(&mut self) {
        self.candidate = None;
        self.restore_past();
    }

    /// Discard the queued frames of stale cameras.
    fn drop_stale(&mut self, live: &[bool], cams: &mut [Camera<T>]) {
        self.restore_past();
        for (i, q) in self.queues.iter_mut().enumerate() {
            if !live[i] {
                cams[i].counts.dropped += q.len() as u64;
                q.clear();
                self.had_drop[i] = false;
            }
        }
        self.candidate = None;
    }

    fn restore_past(&mut self) {
        for (q, p) in self.queues.iter_mut().zip(&mut self.past) {
            while let Some(f) = p.pop() {
                q.push_front(f);
            }
        }
    }

    /// A new candidate: the front frames of the live cameras; frames passed over before
    /// it can never be used (they are older than its frames on their camera).
    fn make_candidate(
        &mut self,
        live: &[bool],
        (start, end): (Nanos, Nanos),
        (pivot, pivot_time): (usize, Nanos),
        cams: &mut [Camera<T>],
    ) {
        let frames = self
            .queues
            .iter()
            .zip(live)
            .map(|(q, &l)| if l { q.front().cloned() } else { None })
            .collect();
        for (i, p) in self.past.iter_mut().enumerate() {
            cams[i].counts.dropped += p.len() as u64;
            p.clear();
        }
        self.candidate = Some(Candidate { frames, start, end, pivot, pivot_time });
    }

    fn pass_over(&mut self, i: usize) {
        if let Some(f) = self.queues[i].pop_front() {
            self.past[i].push(f);
        }
    }

    /// Output the candidate: its frames are used, everything passed over goes back.
    fn publish(&mut self, cams: &mut [Camera<T>]) -> Option<Batch<T>> {
        let cand = self.candidate.take()?;
        self.restore_past();
        let items = cand
            .frames
            .into_iter()
            .enumerate()
            .map(|(i, f)| match f {
                Some(frame) => {
                    // After restoring, the candidate's frame is the queue's front.
                    self.queues[i].pop_front();
                    cams[i].counts.batched += 1;
                    Item::Frame { frame, repeated: false }
                }
                None => Item::Stale,
            })
            .collect();
        Some(Batch { items })
    }

    fn fronts(&self, live: &[bool]) -> Option<((usize, Nanos), (usize, Nanos))> {
        bounds(
            self.queues
                .iter()
                .enumerate()
                .filter(|(i, _)| live[*i])
                .filter_map(|(i, q)| q.front().map(|f| (i, f.stamp_ns))),
        )
    }

    fn process(&mut self, live: &[bool], cams: &mut [Camera<T>]) -> Vec<Batch<T>> {
        let mut out = Vec::new();
        while self.all_ready(live) {
            let Some(((start_i, start_t), (end_i, end_t))) = self.fronts(live) else { break };
            for (i, d) in self.had_drop.iter_mut().enumerate() {
                if i != end_i {
                    *d = false;
                }
            }
            match &self.candidate {
                None => {
                    if end_t - start_t > self.settings.max_interval || self.had_drop[end_i] {
                        if self.queues[start_i].pop_front().is_some() {
                            cams[start_i].counts.dropped += 1;
                        }
                        continue;
                    }
                    self.make_candidate(live, (start_t, end_t), (end_i, end_t), cams);
                }
                Some(c) => {
                    if !Self::no_better(end_t - c.end, start_t - c.start) {
                        // The fronts make a better set than the candidate (same pivot:
                        // its frame is still at the front of its queue).
                        let pivot = (c.pivot, c.pivot_time);
                        self.make_candidate(live, (start_t, end_t), pivot, cams);
                    }
                }
            }
            self.pass_over(start_i);
            let Some(c) = &self.candidate else { break };
            let (c_start, c_end, pivot, pivot_time) = (c.start, c.end, c.pivot, c.pivot_time);
            if start_i == pivot || Self::no_better(end_t - c_end, pivot_time - c_start) {
                out.extend(self.publish(cams));
            } else if !self.all_ready(live) {
                // Could frames still to come make a better set? Look ahead virtually: the
                // next frame of an empty queue is assumed no earlier than the pivot's
                // stamp (nor than the queue's last frame).
                let mut moved: Vec<usize> = Vec::new();
                loop {
                    let times = (0..self.queues.len()).filter(|&i| live[i]).map(|i| {
                        let t = match (self.queues[i].front(), self.past[i].last()) {
                            (Some(f), _) => f.stamp_ns,
                            (None, Some(last)) => last.stamp_ns.max(pivot_time),
                            (None, None) => pivot_time,
                        };
                        (i, t)
                    });
                    let Some(((vs_i, vs_t), (_, ve_t))) = bounds(times) else { break };
                    if Self::no_better(ve_t - c_end, pivot_time - c_start) {
                        out.extend(self.publish(cams));
                        break;
                    }
                    if !Self::no_better(ve_t - c_end, vs_t - c_start)
                        || self.queues[vs_i].is_empty()
                    {
                        // A better set may still come: undo the look-ahead and wait.
                        for i in moved.into_iter().rev() {
                            if let Some(f) = self.past[i].pop() {
                                self.queues[i].push_front(f);
                            }
                        }
                        break;
                    }
                    self.pass_over(vs_i);
                    moved.push(vs_i);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn settings(policy: BatchPolicy) -> BatchSettings {
        BatchSettings {
            policy,
            batch_timeout: 50_000_000,
            max_interval: Nanos::MAX / 4,
            stale_after: Nanos::MAX / 4,
            queue_size: 10,
        }
    }

    /// Feed (stamp in seconds, camera) in order, arrival = stamp; collect the stamp sets.
    fn run_approx(n: usize, queue: usize, input: &[(i64, usize)]) -> Vec<Vec<i64>> {
        let mut b = Batcher::new(
            n,
            BatchSettings { queue_size: queue, ..settings(BatchPolicy::ApproximateTime) },
            0,
        );
        let mut out = Vec::new();
        for (k, &(t, cam)) in input.iter().enumerate() {
            // Arrivals in input order (a frame may carry an earlier stamp than the last).
            let f = Frame { stamp_ns: t * S, received_ns: k as i64, data: Arc::new(()) };
            for batch in b.push(cam, f) {
                out.push(
                    batch.items.iter().map(|i| i.frame().map_or(-1, |f| f.stamp_ns / S)).collect(),
                );
            }
        }
        out
    }

    // The expected sets below are the ones message_filters' own tests
    // (test/test_approximate_time_policy.cpp, ros2/message_filters) assert for the same
    // inputs: the oracle of this policy.

    #[test]
    fn approx_exact_match() {
        let input = [(0, 0), (0, 1), (3, 0), (3, 1), (6, 0), (6, 1)];
        assert_eq!(run_approx(2, 10, &input), vec![vec![0, 0], vec![3, 3], vec![6, 6]]);
    }

    #[test]
    fn approx_perfect_match() {
        let input = [(0, 0), (1, 1), (3, 0), (4, 1), (6, 0), (7, 1)];
        assert_eq!(run_approx(2, 10, &input), vec![vec![0, 1], vec![3, 4]]);
    }

    #[test]
    fn approx_imperfect_match() {
        let input = [(0, 0), (1, 1), (2, 0), (3, 0), (5, 1), (6, 0), (7, 1)];
        assert_eq!(run_approx(2, 10, &input), vec![vec![0, 1], vec![6, 5]]);
    }

    #[test]
    fn approx_acceleration() {
        let input = [(0, 0), (7, 1), (12, 0), (15, 1), (17, 0), (18, 1)];
        assert_eq!(run_approx(2, 10, &input), vec![vec![12, 7], vec![17, 18]]);
    }

    #[test]
    fn approx_dropped_messages() {
        let input =
            [(0, 0), (1, 1), (3, 1), (4, 0), (7, 1), (8, 0), (10, 0), (11, 1), (13, 0), (14, 1)];
        assert_eq!(run_approx(2, 1, &input), vec![vec![4, 3], vec![10, 11]]);
        assert_eq!(
            run_approx(2, 2, &input),
            vec![vec![0, 1], vec![4, 3], vec![8, 7], vec![10, 11]]
        );
    }

    #[test]
    fn approx_long_queue() {
        let mut input: Vec<(i64, usize)> = (0..9).map(|t| (t, 0)).collect();
        input.push((3, 1));
        input.extend((9..13).map(|t| (t, 0)));
        input.push((10, 1));
        input.push((13, 0));
        assert_eq!(run_approx(2, 5, &input), vec![vec![10, 10]]);
    }

    #[test]
    fn approx_double_publish() {
        let input = [(0, 0), (1, 1), (3, 1), (3, 0)];
        assert_eq!(run_approx(2, 10, &input), vec![vec![0, 1], vec![3, 3]]);
    }

    #[test]
    fn approx_four_topics() {
        let input = [
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 3),
            (5, 0),
            (5, 3),
            (6, 1),
            (6, 2),
            (8, 0),
            (9, 1),
            (10, 2),
            (11, 3),
            (10, 0),
            (13, 0),
            (14, 1),
        ];
        assert_eq!(
            run_approx(4, 10, &input),
            vec![vec![0, 1, 2, 3], vec![5, 6, 6, 5], vec![10, 9, 10, 11]]
        );
    }

    #[test]
    fn approx_early_publish() {
        let input = [(0, 0), (1, 1), (2, 2), (3, 3), (7, 0)];
        assert_eq!(run_approx(4, 10, &input), vec![vec![0, 1, 2, 3]]);
    }
    fn frame(stamp_ms: i64, received_ms: i64) -> Frame<()> {
        Frame { stamp_ns: stamp_ms * MS, received_ns: received_ms * MS, data: Arc::new(()) }
    }

    const MS: Nanos = 1_000_000;

    fn stamps(b: &Batch<()>) -> Vec<i64> {
        b.items.iter().map(|i| i.frame().map_or(-1, |f| f.stamp_ns / MS)).collect()
    }

    fn assert_books(b: &Batcher<()>) {
        for i in 0..b.len() {
            let c = b.counts(i);
            assert_eq!(c.received, c.batched + c.dropped + b.pending(i), "camera {i}: {c:?}");
        }
    }

    #[test]
    fn approx_max_interval_bounds_the_spread() {
        // Camera 1 runs 40 ms behind camera 0: with a 30 ms slop no set is possible and
        // the older fronts are dropped; with 50 ms they pair up.
        for (slop, expect) in [(30, 0), (50, 4)] {
            let mut b = Batcher::new(
                2,
                BatchSettings { max_interval: slop * MS, ..settings(BatchPolicy::ApproximateTime) },
                0,
            );
            let mut sets = Vec::new();
            for k in 0..5 {
                let t = 100 * k;
                sets.extend(b.push(0, frame(t + 40, t + 41)));
                sets.extend(b.push(1, frame(t, t + 42)));
            }
            assert_eq!(sets.len(), expect, "slop {slop} ms");
            for s in &sets {
                let st = stamps(s);
                assert!((st[0] - st[1]).abs() <= slop, "{st:?}");
            }
            assert_books(&b);
        }
    }

    #[test]
    fn latest_waits_for_every_camera_or_the_timeout() {
        let mut b = Batcher::new(3, settings(BatchPolicy::Latest), 0);
        assert!(b.push(0, frame(1, 1)).is_empty());
        assert!(b.push(1, frame(2, 2)).is_empty());
        // Camera 0 again before camera 2: the first one is replaced (dropped).
        assert!(b.push(0, frame(3, 3)).is_empty());
        assert_eq!(b.counts(0).dropped, 1);
        let out = b.push(2, frame(4, 4));
        assert_eq!(out.len(), 1);
        assert_eq!(stamps(&out[0]), vec![3, 2, 4]);
        assert!(out[0].items.iter().all(|i| matches!(i, Item::Frame { repeated: false, .. })));
        // Only camera 1 sends: nothing until 50 ms after its frame, then the others repeat.
        assert!(b.push(1, frame(10, 10)).is_empty());
        assert_eq!(b.deadline(), Some(60 * MS));
        assert!(b.poll(59 * MS).is_empty());
        let out = b.poll(60 * MS);
        assert_eq!(stamps(&out[0]), vec![3, 10, 4]);
        let repeated: Vec<bool> =
            out[0].items.iter().map(|i| matches!(i, Item::Frame { repeated: true, .. })).collect();
        assert_eq!(repeated, vec![true, false, true]);
        assert_eq!(b.counts(0).batched, 1, "a repeated frame is counted once");
        assert_books(&b);
    }

    #[test]
    fn a_stale_camera_is_padded_and_not_waited_for_then_comes_back() {
        let s = BatchSettings { stale_after: 200 * MS, ..settings(BatchPolicy::Latest) };
        let mut b = Batcher::new(2, s, 0);
        let mut t = 0;
        let mut full = 0;
        for _ in 0..5 {
            t += 33;
            b.push(0, frame(t, t));
            full += b.push(1, frame(t, t)).len();
        }
        assert_eq!(full, 5);
        // Camera 1 stops. Until it is stale, camera 0's frames wait for the timeout.
        let mut batches = Vec::new();
        while t < 600 {
            t += 33;
            batches.extend(b.poll(t * MS));
            batches.extend(b.push(0, frame(t, t)));
        }
        assert_eq!(b.stale(), vec![false, true]);
        let padded: Vec<_> = batches.iter().filter(|x| matches!(x.items[1], Item::Stale)).collect();
        assert!(padded.len() >= 8, "{} padded batches", padded.len());
        // Once stale, every frame of camera 0 makes a batch at once (no timeout wait).
        let last = batches.last().map(stamps).unwrap_or_default();
        assert_eq!(last, vec![t, -1]);
        // Camera 1 comes back: live again, batches pair both.
        t += 33;
        b.push(1, frame(t, t));
        assert_eq!(b.stale(), vec![false, false]);
        let out = b.push(0, frame(t + 1, t + 1));
        assert_eq!(stamps(&out[0]), vec![t + 1, t]);
        assert_books(&b);
    }

    #[test]
    fn approx_with_a_stale_camera_batches_the_others() {
        let s = BatchSettings {
            stale_after: 200 * MS,
            max_interval: 10 * MS,
            ..settings(BatchPolicy::ApproximateTime)
        };
        let mut b = Batcher::new(3, s, 0);
        let mut sets = Vec::new();
        for k in 0..20 {
            let t = 33 * k;
            sets.extend(b.push(0, frame(t, t + 1)));
            sets.extend(b.push(1, frame(t + 2, t + 2)));
            if k < 5 {
                sets.extend(b.push(2, frame(t + 1, t + 3)));
            }
        }
        assert_eq!(b.stale(), vec![false, false, true]);
        let with_pad = sets.iter().filter(|s| matches!(s.items[2], Item::Stale)).count();
        let full = sets.iter().filter(|s| s.items.iter().all(|i| i.frame().is_some())).count();
        assert!(full >= 4 && with_pad >= 8, "full {full}, padded {with_pad}");
        for s in &sets {
            let st: Vec<i64> = stamps(s).into_iter().filter(|&x| x >= 0).collect();
            let spread = st.iter().max().unwrap() - st.iter().min().unwrap();
            assert!(spread <= 10, "{st:?}");
        }
        assert_books(&b);
    }

    /// splitmix64, for reproducible random arrival sequences.
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    #[test]
    fn approx_properties_on_random_camera_streams() {
        // 4 cameras at different rates with jitter; stamps increase per camera. Every
        // set: one frame per camera, spread <= max_interval, each frame used once, sets
        // never cross; the books balance.
        for seed in 0..40u64 {
            let mut rng = seed;
            let periods = [33, 50, 40, 66];
            let mut next_t = [0i64; 4];
            let mut events = Vec::new();
            for (c, p) in periods.iter().enumerate() {
                while next_t[c] < 3000 {
                    let jitter = (next(&mut rng) % 7) as i64;
                    events.push((next_t[c] + jitter, c));
                    next_t[c] += p;
                }
            }
            // Arrival order: by stamp plus a random delivery delay of up to 20 ms.
            let mut arrivals: Vec<(i64, i64, usize)> =
                events.iter().map(|&(t, c)| (t + (next(&mut rng) % 20) as i64, t, c)).collect();
            arrivals.sort();
            // Keep per-camera stamp order (a camera's frames arrive in order).
            let mut last = [-1i64; 4];
            arrivals.retain(|&(_, t, c)| {
                let ok = t > last[c];
                if ok {
                    last[c] = t;
                }
                ok
            });
            let s = BatchSettings {
                max_interval: 25 * MS,
                queue_size: 1 + (seed % 5) as usize,
                ..settings(BatchPolicy::ApproximateTime)
            };
            let mut b = Batcher::new(4, s, 0);
            let mut prev = [-1i64; 4];
            for &(at, t, c) in &arrivals {
                for set in b.push(c, frame(t, at)) {
                    let st = stamps(&set);
                    assert!(st.iter().all(|&x| x >= 0), "seed {seed}: {st:?}");
                    let spread = st.iter().max().unwrap() - st.iter().min().unwrap();
                    assert!(spread <= 25, "seed {seed}: spread {spread} in {st:?}");
                    for (i, &x) in st.iter().enumerate() {
                        assert!(x > prev[i], "seed {seed}: camera {i} reused or crossed: {st:?}");
                        prev[i] = x;
                    }
                }
            }
            assert!(prev.iter().all(|&p| p > 1000), "seed {seed}: too few sets: {prev:?}");
            assert_books(&b);
        }
    }
}
