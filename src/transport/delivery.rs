//! Frames lost before they reach the node: from what a subscriber can see (the sizes
//! and header stamps of the images that arrive, and the camera_info messages, which are
//! small enough to arrive whole), estimate the rate the camera publishes at and compare
//! it with the rate images arrive at.
//!
//! The camera's rate comes from `camera_info` when it arrives (drivers publish one per
//! frame, with the frame's stamp), else from the image stamps: the frames that arrive
//! are a subset of the camera's, so the gaps between their stamps are whole multiples
//! of its frame period; the largest period that fits every gap of the last
//! `STAMPS_KEPT` (32) images, with at least two different multiples (a steady slow camera
//! fits with all gaps = 1 period), is taken, and only if gaps with no common period would
//! fit it that well by chance less than once in a million (`CHANCE`): the stamps of an
//! overloaded publisher are jittered, and a few jittered gaps of a camera whose frames
//! all arrive can fit a fraction of its period (with 8 gaps, about 1 window in 20,000
//! did: a false "frames lost" warning). A slow camera whose frames all arrive is never
//! flagged: its gaps are one period. A loss of exactly every other (or every third...)
//! frame cannot be told from a slower camera by the stamps alone: `camera_info` tells.
//!
//! Frames that arrive late (`Timeliness`): a transport that repairs lost fragments (a
//! reliable camera whose large frames go over UDP) delivers frames late and in bursts,
//! several at once after a stall. The age of a frame (arrival - stamp) alone cannot say
//! so: the camera's clock may be another machine's, or a recording's (a bag replayed
//! without `--clock` has stamps hours old, by design). So only the arrival pattern
//! is judged, against the stamps' own spacing: how much later than the window's
//! quickest frame each frame arrives (any clock offset cancels), and how many frames
//! arrive much closer together than they were stamped. A live camera (its stamps near the
//! node's clock, `LIVE_AGE_S`) is always judged; other frames only while the stamps
//! advance at the arrival rate (a replay at rate 1): a replay at another rate, or as fast
//! as possible, is not a camera's transport.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back arrivals are kept for the arrival and camera_info rates.
pub(crate) const WINDOW: Duration = Duration::from_secs(15);
/// Stamps kept for the period fit: the last [`STAMPS_KEPT`] images of at most this long
/// ago (when nearly every frame is lost, a few arrive per minute: the fit needs
/// [`MIN_GAPS`] gaps).
pub(crate) const STAMP_WINDOW: Duration = Duration::from_secs(120);
/// Images whose stamps are kept for the period fit.
pub(crate) const STAMPS_KEPT: usize = 32;
/// Samples at least this large travel as several UDP fragments when they do not fit
/// the publisher's shared-memory segment; best-effort ones are then mostly lost.
pub(crate) const LARGE_SAMPLE: usize = 64 * 1024;
/// Raise the warning when fewer than this fraction of the camera's frames arrive...
pub(crate) const RAISE_BELOW: f64 = 0.5;
/// ...and clear it when at least this fraction arrives again.
pub(crate) const CLEAR_ABOVE: f64 = 0.8;
/// Fastest camera considered (a shorter fitted period is noise).
const MIN_PERIOD_S: f64 = 1.0 / 240.0;
/// A gap fits a period when it is within this fraction of a period of a whole multiple.
const GAP_TOLERANCE: f64 = 0.1;
/// Gaps needed before the stamps say anything.
pub(crate) const MIN_GAPS: usize = 5;
/// A fitted period is taken only when gaps with no common period would fit it as
/// closely less often than this ([`fit_period`]). Every gap kept ([`STAMPS_KEPT`]) must
/// fit: a late stamp leaves the delivery unknown until it leaves the kept stamps, which
/// is not judged wrong; a fit to a few jittered gaps is (a false warning).
pub(crate) const CHANCE: f64 = 1e-6;
/// Gaps longer than this (or not positive: a looped recording, a clock jump) are not
/// used.
const MAX_GAP_S: f64 = 60.0;
/// camera_info messages needed in the window to use their rate.
const MIN_CAMERA_INFOS: usize = 10;
/// Shortest observation before anything is said.
const MIN_SPAN: Duration = Duration::from_secs(3);
/// How far back arrivals are judged for their timeliness (shorter than [`WINDOW`]: a
/// transport that recovers is seen on time again within seconds).
pub(crate) const TIMELY_WINDOW: Duration = Duration::from_secs(5);
/// Frames in [`TIMELY_WINDOW`] needed before their timeliness is judged.
pub(crate) const MIN_TIMED: usize = 20;
/// A frame arrives "in a burst" when it comes less than this fraction of its stamp gap
/// after the previous frame (a frame that waited for repairs, released with the next).
pub(crate) const BURST_GAP: f64 = 0.25;
/// Late: at least this share of the window's frames arrive in bursts...
pub(crate) const BURSTS_RAISE: f64 = 0.10;
/// ...or the median frame arrives at least this many frame periods later than the
/// window's quickest frame.
pub(crate) const LATE_RAISE_PERIODS: f64 = 1.0;
/// On time again: fewer bursts than this share...
pub(crate) const BURSTS_CLEAR: f64 = 0.05;
/// ...and the median frame less than this many periods behind the quickest.
pub(crate) const LATE_CLEAR_PERIODS: f64 = 0.5;
/// The stamps advance at the arrival rate when (arrival span) / (stamp span) is within
/// these bounds.
pub(crate) const REAL_TIME: (f64, f64) = (0.8, 1.25);
/// A frame whose stamp is within this of the node's (system) clock when it arrives comes
/// from a live camera: a late live frame is late by far less, and a recording's stamps (a
/// bag replayed without `--clock`) are hours or years old. Something a late live camera
/// cannot fake, unlike the ratio of its stamps to its arrivals, which a transport that
/// stalls and catches up moves away from 1.
pub(crate) const LIVE_AGE_S: f64 = 10.0;

/// Where the camera's rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Basis {
    /// The rate of `camera_info` messages.
    CameraInfo,
    /// The period fitted to the image stamps.
    Stamps,
}

/// Arrival against the camera's rate, over the window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Delivery {
    /// Images that arrived per second.
    pub arrived_hz: f64,
    /// Frames the camera published per second (estimated).
    pub camera_hz: f64,
    /// Fraction of the camera's frames that arrived (0..=1).
    pub fraction: f64,
    /// Where `camera_hz` came from.
    pub basis: Basis,
    /// Largest image that arrived, bytes.
    pub largest_bytes: usize,
}

/// When the frames of the window arrived, against their stamps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Timeliness {
    /// The stamps advance at the arrival rate: the pattern is judged.
    RealTime {
        /// The stamps' median spacing, s (the camera's period, or a multiple under loss).
        period_s: f64,
        /// How much later than the window's quickest frame the median frame arrives
        /// (relative to its stamp), s.
        late_p50_s: f64,
        /// The same, 90th percentile, s.
        late_p90_s: f64,
        /// Share of frames that arrived in a burst ([`BURST_GAP`]).
        bursts: f64,
        /// Frames judged.
        frames: usize,
    },
    /// The stamps advance at `ratio` times the arrival rate (a replay at another rate):
    /// not judged.
    OtherRate {
        /// (stamp span) / (arrival span).
        ratio: f64,
    },
}

impl Timeliness {
    /// Frames arrive late or in bursts ([`BURSTS_RAISE`], [`LATE_RAISE_PERIODS`]).
    pub(crate) fn late(&self) -> bool {
        match *self {
            Timeliness::RealTime { period_s, late_p50_s, bursts, .. } => {
                bursts >= BURSTS_RAISE || late_p50_s >= LATE_RAISE_PERIODS * period_s
            }
            Timeliness::OtherRate { .. } => false,
        }
    }

    /// Frames arrive on time again ([`BURSTS_CLEAR`], [`LATE_CLEAR_PERIODS`]), or the
    /// pattern is no longer judged.
    pub(crate) fn on_time(&self) -> bool {
        match *self {
            Timeliness::RealTime { period_s, late_p50_s, bursts, .. } => {
                bursts < BURSTS_CLEAR && late_p50_s < LATE_CLEAR_PERIODS * period_s
            }
            Timeliness::OtherRate { .. } => true,
        }
    }
}

/// The timeliness of frames that arrived at `arrivals` (s, any origin, in arrival order)
/// with header stamps `stamps_ns`; `None` with fewer than [`MIN_TIMED`] frames or
/// stamps that never advance (the tests; the monitor calls [`timeliness_of`]).
#[cfg(test)]
pub(crate) fn timeliness(arrivals: &[f64], stamps_ns: &[i64]) -> Option<Timeliness> {
    timeliness_of(arrivals, stamps_ns, false)
}

/// [`timeliness`], told whether the frames are `live` (their stamps near the node's clock,
/// [`LIVE_AGE_S`]): a live camera's pattern is judged whatever the ratio of its stamps to
/// its arrivals (a stalled transport catching up moves that ratio, and is what must be
/// flagged); frames not known to be live are judged only while their stamps advance at the
/// arrival rate (a replay at rate 1), as [`timeliness`] does.
pub(crate) fn timeliness_of(arrivals: &[f64], stamps_ns: &[i64], live: bool) -> Option<Timeliness> {
    let n = arrivals.len().min(stamps_ns.len());
    if n < MIN_TIMED {
        return None;
    }
    let stamp = |i: usize| (stamps_ns[i] - stamps_ns[0]) as f64 * 1e-9;
    let stamp_span = stamp(n - 1);
    let arrival_span = arrivals[n - 1] - arrivals[0];
    if stamp_span <= 0.0 || arrival_span <= 0.0 {
        return None;
    }
    let ratio = stamp_span / arrival_span;
    if !live && !(REAL_TIME.0..=REAL_TIME.1).contains(&ratio) {
        return Some(Timeliness::OtherRate { ratio });
    }
    let mut gaps = Vec::with_capacity(n);
    let mut bursts = 0usize;
    for i in 1..n {
        let stamp_gap = stamp(i) - stamp(i - 1);
        if stamp_gap > 0.0 {
            gaps.push(stamp_gap);
            bursts += usize::from(arrivals[i] - arrivals[i - 1] < BURST_GAP * stamp_gap);
        }
    }
    if gaps.is_empty() {
        return None;
    }
    // Arrival relative to the stamp, behind the quickest frame of the window.
    let mut late: Vec<f64> = (0..n).map(|i| (arrivals[i] - arrivals[0]) - stamp(i)).collect();
    let quickest = late.iter().copied().fold(f64::INFINITY, f64::min);
    late.iter_mut().for_each(|l| *l -= quickest);
    late.sort_by(f64::total_cmp);
    gaps.sort_by(f64::total_cmp);
    let at = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Some(Timeliness::RealTime {
        period_s: at(&gaps, 0.5),
        late_p50_s: at(&late, 0.5),
        late_p90_s: at(&late, 0.9),
        bursts: bursts as f64 / gaps.len() as f64,
        frames: n,
    })
}

/// Arrivals of images and camera_infos over the last [`WINDOW`].
#[derive(Debug, Default)]
pub(crate) struct DeliveryMonitor {
    started: Option<Instant>,
    /// (arrival, header stamp in ns, bytes of pixel data) over [`WINDOW`]
    images: VecDeque<(Instant, i64, usize)>,
    infos: VecDeque<Instant>,
    /// (arrival, header stamp in ns, bytes) of the last [`STAMPS_KEPT`] images within
    /// [`STAMP_WINDOW`]
    stamps: VecDeque<(Instant, i64, usize)>,
    /// (arrival, the node's clock at arrival - stamp, s) over [`WINDOW`], when the node's
    /// clock is the system's (not sim time)
    ages: VecDeque<(Instant, f64)>,
}

impl DeliveryMonitor {
    /// An image arrived.
    pub(crate) fn image(&mut self, at: Instant, stamp_ns: i64, bytes: usize) {
        self.started.get_or_insert(at);
        self.images.push_back((at, stamp_ns, bytes));
        self.stamps.push_back((at, stamp_ns, bytes));
        if self.stamps.len() > STAMPS_KEPT {
            self.stamps.pop_front();
        }
        self.trim(at);
    }

    /// The image that arrived at `at` was `age_s` old on the node's clock (the node's
    /// system clock minus its stamp; not told under sim time, whose clock is a recording's).
    pub(crate) fn image_age(&mut self, at: Instant, age_s: f64) {
        self.ages.push_back((at, age_s));
        self.trim(at);
    }

    /// A camera_info arrived.
    pub(crate) fn camera_info(&mut self, at: Instant) {
        self.started.get_or_insert(at);
        self.infos.push_back(at);
        self.trim(at);
    }

    /// True while an image arrived within [`STAMP_WINDOW`] (the camera is there).
    pub(crate) fn images_recently(&self, now: Instant) -> bool {
        self.stamps.back().is_some_and(|i| now.duration_since(i.0) < STAMP_WINDOW)
    }

    /// Forget everything (e.g. when the subscription was recreated).
    pub(crate) fn reset(&mut self) {
        *self = DeliveryMonitor::default();
    }

    fn trim(&mut self, now: Instant) {
        if let Some(from) = now.checked_sub(STAMP_WINDOW) {
            while self.stamps.front().is_some_and(|i| i.0 < from) {
                self.stamps.pop_front();
            }
        }
        let Some(from) = now.checked_sub(WINDOW) else {
            return;
        };
        while self.images.front().is_some_and(|i| i.0 < from) {
            self.images.pop_front();
        }
        while self.infos.front().is_some_and(|&t| t < from) {
            self.infos.pop_front();
        }
        while self.ages.front().is_some_and(|a| a.0 < from) {
            self.ages.pop_front();
        }
    }

    /// When the frames of the last [`TIMELY_WINDOW`] arrived against their stamps
    /// ([`timeliness`]).
    pub(crate) fn timeliness(&mut self, now: Instant) -> Option<Timeliness> {
        self.trim(now);
        // Not the first MIN_SPAN after the first frame: a node that starts (or a camera
        // that connects) on a loaded machine takes its first frames in a burst.
        let from = now.checked_sub(TIMELY_WINDOW)?.max(self.started? + MIN_SPAN);
        let recent: Vec<&(Instant, i64, usize)> =
            self.images.iter().filter(|i| i.0 >= from).collect();
        let first = recent.first()?.0;
        let arrivals: Vec<f64> =
            recent.iter().map(|i| i.0.duration_since(first).as_secs_f64()).collect();
        let stamps: Vec<i64> = recent.iter().map(|i| i.1).collect();
        // Live when the median age of the same frames is within LIVE_AGE_S.
        let mut ages: Vec<f64> = self.ages.iter().filter(|a| a.0 >= from).map(|a| a.1).collect();
        ages.sort_by(f64::total_cmp);
        let live = ages.get(ages.len() / 2).is_some_and(|a| a.abs() < LIVE_AGE_S);
        timeliness_of(&arrivals, &stamps, live)
    }

    /// The largest image of the last [`WINDOW`], bytes.
    pub(crate) fn largest(&self) -> usize {
        self.images.iter().map(|i| i.2).max().unwrap_or(0)
    }

    /// Arrival against the camera's rate, or `None` while there is not enough to say.
    pub(crate) fn assess(&mut self, now: Instant) -> Option<Delivery> {
        self.trim(now);
        let started = self.started?;
        let span = now.duration_since(started).min(WINDOW);
        if span < MIN_SPAN {
            return None;
        }
        let secs = span.as_secs_f64();
        if self.infos.len() >= MIN_CAMERA_INFOS {
            // Nothing may arrive at all: then the camera_info says the camera runs.
            let arrived_hz = self.images.len() as f64 / secs;
            let camera_hz = self.infos.len() as f64 / secs;
            let largest_bytes = self.images.iter().map(|i| i.2).max().unwrap_or(0);
            let fraction = (arrived_hz / camera_hz).min(1.0);
            return Some(Delivery {
                arrived_hz,
                camera_hz,
                fraction,
                basis: Basis::CameraInfo,
                largest_bytes,
            });
        }
        // From the stamps of the last images (over up to STAMP_WINDOW: when nearly all
        // frames are lost, a few arrive per minute).
        let stamps: Vec<i64> = self.stamps.iter().map(|i| i.1).collect();
        let (period, expected) = expected_frames(&stamps)?;
        // The frames the fit covered (every kept one), over the time they took to arrive:
        // from the first of them to now (so the rate falls when frames stop coming).
        let covered = self.stamps.len();
        let first = self.stamps.front()?.0;
        let seen = now.duration_since(first).as_secs_f64();
        if seen <= 0.0 {
            return None;
        }
        Some(Delivery {
            arrived_hz: (covered - 1) as f64 / seen,
            camera_hz: 1.0 / period,
            fraction: (covered as f64 / expected).min(1.0),
            basis: Basis::Stamps,
            largest_bytes: self.stamps.iter().map(|i| i.2).max().unwrap_or(0),
        })
    }
}

/// The camera's period (s) fitted to the stamps (in arrival order) and how many frames
/// it published from the first to the last of them.
fn expected_frames(stamps_ns: &[i64]) -> Option<(f64, f64)> {
    let gaps: Vec<f64> = stamps_ns
        .windows(2)
        .map(|w| (w[1] - w[0]) as f64 * 1e-9)
        .filter(|&g| g > 0.0 && g <= MAX_GAP_S)
        .collect();
    let period = fit_period(&gaps)?;
    let multiples: f64 = gaps.iter().map(|g| (g / period).round()).sum();
    Some((period, multiples + 1.0))
}

/// The largest period `p >= MIN_PERIOD_S` such that every gap is `k * p` (whole `k >=
/// 1`) within [`GAP_TOLERANCE`]` * p`, with at least two different `k`, and fitted far
/// better than chance ([`chance_of_fit`] at most [`CHANCE`]); `None` if none fits, the
/// largest that fits is no better than chance, or there are fewer than [`MIN_GAPS`] gaps.
/// Candidates are the smallest gap divided by 1, 2, 3, ...; each is refined over the gaps
/// in increasing order (`p = sum of gaps / sum of multiples`), so that rounding the long
/// gaps uses a period the short ones have already pinned down.
pub(crate) fn fit_period(gaps_s: &[f64]) -> Option<f64> {
    if gaps_s.len() < MIN_GAPS {
        return None;
    }
    let mut gaps = gaps_s.to_vec();
    gaps.sort_by(f64::total_cmp);
    let smallest = gaps[0];
    let most = (smallest / MIN_PERIOD_S).floor() as u32;
    for m in 1..=most {
        let Some((p, several)) = fit_candidate(&gaps, smallest / f64::from(m)) else {
            continue;
        };
        // One multiple only: a steady camera at p * k, not a lossy one at p. A shorter
        // period (the next candidates) would fit no better than this one by chance.
        let sure = p >= MIN_PERIOD_S && several && chance_of_fit(&gaps, p, m) <= CHANCE;
        return sure.then_some(p);
    }
    None
}

/// The candidate period `p` refined over the (sorted) gaps, and whether they are at least
/// two different multiples of it; `None` when a gap is not a multiple within
/// [`GAP_TOLERANCE`].
fn fit_candidate(gaps: &[f64], mut p: f64) -> Option<(f64, bool)> {
    let (mut sum_gap, mut sum_k) = (0.0, 0.0);
    let (mut k_min, mut k_max) = (f64::MAX, 0.0f64);
    for &g in gaps {
        let k = (g / p).round();
        if k < 1.0 || (g - k * p).abs() > GAP_TOLERANCE * p {
            return None;
        }
        sum_gap += g;
        sum_k += k;
        p = sum_gap / sum_k;
        k_min = k_min.min(k);
        k_max = k_max.max(k);
    }
    Some((p, k_max > k_min))
}

/// How likely gaps with no common period (whose remainders modulo `p` are uniform) fit
/// `p`, the `candidate`-th period tried, as closely as `gaps` do: each gap but the one
/// that chose the candidate lands within `r` periods of a multiple with chance `2 r`,
/// where `r` is the half-width of a uniform spread with the gaps' RMS remainder
/// (`sqrt(3) * RMS`; less sensitive to one late stamp than the largest remainder), and any
/// of the `candidate` periods tried might have fitted. Modelled on the stamps of 30 Hz cameras
/// whose frames all arrive, each stamp up to 0.1-1 period late (uniform, exponential or
/// normal): without this bound about 1 window of 5 gaps in 200 and of 8 gaps in 20,000
/// misfits; with it none of 324,000 windows of 5-10 gaps did, nor (bound or not) any of
/// 360,000 of 12-31 gaps.
fn chance_of_fit(gaps: &[f64], p: f64, candidate: u32) -> f64 {
    let n = gaps.len() as f64;
    let mean_square = gaps.iter().map(|g| (g / p - (g / p).round()).powi(2)).sum::<f64>() / n;
    let r = (3.0 * mean_square).sqrt();
    f64::from(candidate) * (2.0 * r).powf(n - 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// Stamps of the frames of a `hz` camera that arrive, with a deterministic jitter of
    /// up to `jitter_ms`.
    fn stamps(hz: f64, frames: &[u64], jitter_ms: f64) -> Vec<i64> {
        frames
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let j = jitter_ms * 1e-3 * (((i * 7919) % 13) as f64 / 6.0 - 1.0);
                ((f as f64 / hz + j) * 1e9) as i64 + 1_700_000_000_000_000_000
            })
            .collect()
    }

    #[test]
    fn a_lossy_30hz_camera_is_found_from_its_stamps() {
        // 9 of 450 frames of a 30 Hz camera arrived (2 %), stamps with +-1 ms jitter.
        let frames = [3, 51, 97, 140, 201, 246, 300, 377, 449];
        let (p, expected) = expected_frames(&stamps(30.0, &frames, 1.0)).unwrap();
        assert!((p - 1.0 / 30.0).abs() < 2e-4, "period {p}");
        assert_eq!(expected, 447.0);
    }

    #[test]
    fn a_slow_camera_whose_frames_all_arrive_is_not_lossy() {
        // Every frame of a 2 Hz camera: all gaps are one period, so no period is fitted
        // at all (not even p / 2, which has only the multiple 2).
        let all: Vec<u64> = (0..20).collect();
        assert_eq!(expected_frames(&stamps(2.0, &all, 2.0)), None);
        // Half the frames of a 2 Hz camera: found, and 50 % arrived.
        let half = [0, 1, 3, 4, 6, 8, 9, 11];
        let (p, expected) = expected_frames(&stamps(2.0, &half, 2.0)).unwrap();
        assert!((p - 0.5).abs() < 1e-3, "period {p}");
        assert_eq!(expected, 12.0);
    }

    #[test]
    fn irregular_gaps_fit_no_period() {
        // Gaps of a source publishing on events: no common period.
        let gaps = [0.213, 0.377, 0.291, 0.458, 0.333, 0.527, 0.241];
        assert_eq!(fit_period(&gaps), None);
        assert_eq!(fit_period(&[0.1, 0.2, 0.3]), None, "too few gaps");
    }

    /// A uniform draw in [0, 1).
    fn uniform(rng: &mut SplitMix64) -> f64 {
        (rng.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The monitor fed with 6 MB images stamped `stamps_s` (s from an origin, in arrival
    /// order), each arriving 3 ms after its stamp, and assessed `after_s` after the origin
    /// (camera_infos too, at `info_hz`, when given).
    fn monitored(stamps_s: &[f64], after_s: f64, info_hz: Option<f64>) -> Option<Delivery> {
        let t0 = Instant::now();
        let mut m = DeliveryMonitor::default();
        let mut infos = info_hz.map(|hz| (0u32..).map(move |i| f64::from(i) / hz).peekable());
        for &s in stamps_s.iter().filter(|&&s| s + 0.003 <= after_s) {
            while let Some(at) = infos.as_mut().and_then(|i| i.next_if(|&at| at <= s)) {
                m.camera_info(t0 + Duration::from_secs_f64(at));
            }
            let stamp = 1_700_000_000_000_000_000 + (s * 1e9) as i64;
            m.image(t0 + Duration::from_secs_f64(s + 0.003), stamp, 6_220_800);
        }
        m.assess(t0 + Duration::from_secs_f64(after_s))
    }

    /// What the diagnostics raise the "frames lost" WARN on (large images, [`RAISE_BELOW`]).
    fn warns(d: Option<Delivery>) -> bool {
        d.is_some_and(|d| d.fraction < RAISE_BELOW && d.largest_bytes >= LARGE_SAMPLE)
    }

    /// The fit before [`CHANCE`]: the last 8 gaps, any period that fits them.
    fn fit_to_8_gaps(stamps_s: &[f64]) -> Option<f64> {
        let mut gaps: Vec<f64> = stamps_s.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.drain(..gaps.len().saturating_sub(8));
        if gaps.len() < MIN_GAPS {
            return None;
        }
        gaps.sort_by(f64::total_cmp);
        (1..=(gaps[0] / MIN_PERIOD_S) as u32)
            .find_map(|m| fit_candidate(&gaps, gaps[0] / f64::from(m)))
            .and_then(|(p, several)| several.then_some(p))
    }

    #[test]
    fn jittered_stamps_of_a_complete_camera_never_raise_the_warning() {
        // 20,000 windows of cameras at 2-60 Hz whose frames all arrive, observed for
        // 3.5-20 s (from the first assessments, with few gaps, to the steady state),
        // stamped by an overloaded publisher: each stamp up to J periods late (J 0.1-1).
        let mut rng = SplitMix64::new(44);
        let (mut raised, mut fitted, mut old_misfits) = (0, 0, 0);
        for _ in 0..20_000 {
            let hz = [2.0, 5.0, 10.0, 15.0, 30.0, 60.0][rng.below(6) as usize];
            let late = 0.1 + 0.9 * uniform(&mut rng);
            let secs = 3.5 + 16.5 * uniform(&mut rng);
            let mut stamps: Vec<f64> = (0..(secs * hz) as u32)
                .map(|i| (f64::from(i) + late * uniform(&mut rng)) / hz)
                .collect();
            stamps.sort_by(f64::total_cmp);
            let kept = &stamps[stamps.len().saturating_sub(STAMPS_KEPT)..];
            old_misfits += usize::from(fit_to_8_gaps(kept).is_some_and(|p| p < 0.9 / hz));
            let d = monitored(&stamps, secs + 0.01, None);
            fitted += usize::from(d.is_some());
            raised += usize::from(warns(d));
        }
        assert_eq!((raised, fitted), (0, 0));
        // The same windows misfitted 1/2-1/7 of the period when 8 gaps were enough (8 of
        // them with this seed).
        assert!(old_misfits >= 5, "{old_misfits}");
    }

    /// The frames that arrive of a `hz` camera over `secs`: `arrives(i)` for frame `i`,
    /// stamped within +-0.5 ms (`rng`).
    fn arriving(
        hz: f64,
        secs: f64,
        rng: &mut SplitMix64,
        mut arrives: impl FnMut(u32, &mut SplitMix64) -> bool,
    ) -> Vec<(u32, f64)> {
        let mut frames = Vec::new();
        for i in 0..(secs * hz) as u32 {
            if arrives(i, rng) {
                frames.push((i, 0.001 + f64::from(i) / hz + 5e-4 * (2.0 * uniform(rng) - 1.0)));
            }
        }
        frames
    }

    /// Asserts what the monitor says of a lossy window: the camera's rate and the share of
    /// its frames that arrived (over the kept stamps) exactly, whenever it says anything,
    /// and always with 12 or more gaps; returns whether the WARN is raised.
    fn check_lossy(hz: f64, secs: f64, frames: &[(u32, f64)]) -> Option<bool> {
        let stamps: Vec<f64> = frames.iter().map(|f| f.1).collect();
        let d = monitored(&stamps, secs + 0.01, None);
        let kept = &frames[frames.len().saturating_sub(STAMPS_KEPT)..];
        let Some(d) = d else {
            // Not yet MIN_SPAN since the first frame arrived, too few gaps to be sure, or a
            // gap that fits no multiple within GAP_TOLERANCE (stamp jitter): unknown.
            return None;
        };
        let published = f64::from(kept[kept.len() - 1].0 - kept[0].0 + 1);
        assert!((d.camera_hz - hz).abs() < 0.005 * hz, "{hz} Hz: {d:?}");
        assert!((d.fraction - kept.len() as f64 / published).abs() < 1e-9, "{hz} Hz: {d:?}");
        Some(warns(Some(d)))
    }

    #[test]
    fn regular_and_random_losses_raise_the_warning() {
        let mut rng = SplitMix64::new(4444);
        let (mut raised, mut judged) = (0, 0);
        for w in 0..6_000u32 {
            let hz = [15.0, 30.0, 60.0][rng.below(3) as usize];
            let secs = 3.5 + 16.5 * uniform(&mut rng);
            let frames = if w % 2 == 0 {
                // Regular: about 1 in n arrives (n = 2..7), in a fixed pattern of gaps of
                // n and n + 1 frames (exactly 1 in n looks like a slower camera).
                let n = 2.0 + rng.below(6) as f64;
                let share = 1.0 / (n + 0.25 + 0.5 * uniform(&mut rng));
                let phase = uniform(&mut rng);
                arriving(hz, secs, &mut rng, |i, _| {
                    (f64::from(i + 1) * share + phase).floor()
                        > (f64::from(i) * share + phase).floor()
                })
            } else {
                // Random: each frame arrives with probability 0.03-0.4.
                let p = [0.4, 0.3, 0.2, 0.1, 0.03][rng.below(5) as usize];
                arriving(hz, secs, &mut rng, |_, rng| uniform(rng) < p)
            };
            if let Some(warned) = check_lossy(hz, secs, &frames) {
                judged += 1;
                let kept = &frames[frames.len().saturating_sub(STAMPS_KEPT)..];
                let share = kept.len() as f64 / f64::from(kept[kept.len() - 1].0 - kept[0].0 + 1);
                assert_eq!(warned, share < RAISE_BELOW, "{hz} Hz, {share} arrived");
                raised += usize::from(warned);
            }
        }
        assert!(judged > 5_500 && raised > 5_000, "{judged} judged, {raised} raised");
    }

    #[test]
    fn the_named_rates_are_the_cameras_and_the_arrivals() {
        // A 30 Hz camera of which 12 frames/s arrive (2 of every 5, all as published), seen
        // from the first assessment (3 s) to the steady state, from its stamps and from
        // its camera_info: the report says ~12 of ~30.
        const WITHIN: f64 = 0.05;
        let mut rng = SplitMix64::new(12);
        let frames = arriving(30.0, 70.0, &mut rng, |i, _| i % 5 == 0 || i % 5 == 2);
        let stamps: Vec<f64> = frames.iter().map(|f| f.1).collect();
        for after in [3.01, 3.5, 4.0, 5.0, 10.0, 20.0, 60.0] {
            for info in [None, Some(30.0)] {
                let d = monitored(&stamps, after, info).unwrap();
                let basis = if info.is_some() { Basis::CameraInfo } else { Basis::Stamps };
                assert_eq!(d.basis, basis);
                assert!((d.camera_hz - 30.0).abs() < WITHIN * 30.0, "at {after} s: {d:?}");
                assert!((d.arrived_hz - 12.0).abs() < WITHIN * 12.0, "at {after} s: {d:?}");
                assert!((d.fraction - 0.4).abs() < WITHIN * 0.4, "at {after} s: {d:?}");
                assert!(warns(Some(d)));
            }
        }
    }

    #[test]
    fn camera_info_gives_the_rate_when_it_arrives() {
        let t0 = Instant::now();
        let mut m = DeliveryMonitor::default();
        // 4 s: camera_info at 30 Hz, images at 1 Hz (6 MB each).
        for i in 0..120u32 {
            let at = t0 + Duration::from_millis(u64::from(i) * 1000 / 30);
            m.camera_info(at);
            if i % 30 == 0 {
                m.image(at, i64::from(i), 6_220_800);
            }
        }
        let d = m.assess(t0 + Duration::from_secs(4)).unwrap();
        assert_eq!(d.basis, Basis::CameraInfo);
        assert!((d.camera_hz - 30.0).abs() < 0.5 && (d.arrived_hz - 1.0).abs() < 0.1, "{d:?}");
        assert!((d.fraction - 1.0 / 30.0).abs() < 0.01, "{d:?}");
        assert_eq!(d.largest_bytes, 6_220_800);
        // Too early: nothing said.
        let mut early = DeliveryMonitor::default();
        early.camera_info(t0);
        early.image(t0, 0, 10);
        assert_eq!(early.assess(t0 + Duration::from_secs(1)), None);
    }

    #[test]
    fn a_few_frames_a_minute_are_enough_over_the_stamp_window() {
        // 0.1 % of a 30 Hz camera: 7 frames in 100 s (gaps of 9-20 s); each arrives when
        // it is stamped. The 15 s window never holds 6 of them; the stamp window does.
        let t0 = Instant::now();
        let frames = [0u64, 301, 562, 1163, 1489, 2040, 2611];
        let stamps = stamps(30.0, &frames, 1.0);
        let mut m = DeliveryMonitor::default();
        for (&f, &s) in frames.iter().zip(&stamps) {
            m.image(t0 + Duration::from_millis(f * 1000 / 30), s, 6_220_800);
        }
        let d = m.assess(t0 + Duration::from_secs(90)).unwrap();
        assert_eq!(d.basis, Basis::Stamps);
        assert!((d.camera_hz - 30.0).abs() < 0.05, "{d:?}");
        assert!(d.fraction < 0.01, "{d:?}");
    }

    #[test]
    fn camera_info_without_any_image_is_total_loss() {
        let t0 = Instant::now();
        let mut m = DeliveryMonitor::default();
        for i in 0..150u64 {
            m.camera_info(t0 + Duration::from_millis(i * 1000 / 30));
        }
        let d = m.assess(t0 + Duration::from_secs(5)).unwrap();
        assert_eq!((d.basis, d.fraction, d.largest_bytes), (Basis::CameraInfo, 0.0, 0));
    }

    /// Arrivals (s) and stamps (ns, from `origin_s`) of `n` frames of a 30 Hz camera,
    /// frame `i` arriving `delay(i)` s after its stamp.
    fn paced(n: usize, origin_s: f64, delay: impl Fn(usize) -> f64) -> (Vec<f64>, Vec<i64>) {
        let stamps: Vec<f64> = (0..n).map(|i| i as f64 / 30.0).collect();
        let arrivals = stamps.iter().enumerate().map(|(i, s)| s + delay(i)).collect();
        (arrivals, stamps.iter().map(|s| ((origin_s + s) * 1e9) as i64).collect())
    }

    #[test]
    fn frames_on_time_are_on_time_whatever_the_clock_offset() {
        // 3 +- 1 ms of transit, stamps of now or of a recording three years old.
        for origin in [1.7e9, 1.6e9] {
            let (a, s) = paced(120, origin, |i| 0.003 + 0.001 * ((i % 3) as f64 - 1.0));
            let t = timeliness(&a, &s).unwrap();
            let Timeliness::RealTime { period_s, late_p50_s, bursts, frames, .. } = t else {
                panic!("{t:?}")
            };
            assert!((period_s - 1.0 / 30.0).abs() < 1e-6 && frames == 120, "{t:?}");
            // (stamps in f64 ns near 1.7e18 are exact to ~256 ns)
            assert!((late_p50_s - 0.001).abs() < 1e-6 && bursts == 0.0, "{t:?}");
            assert!(!t.late() && t.on_time());
        }
    }

    #[test]
    fn repair_bursts_are_late() {
        // Every 5th frame waits ~100 ms for a repair, and the frames behind it wait for
        // it (in-order delivery): released together.
        let delay = |i: usize| {
            let k = i % 5;
            if k < 3 {
                0.100 - k as f64 / 30.0
            } else {
                0.003
            }
        };
        let (a, s) = paced(150, 1.7e9, delay);
        let t = timeliness(&a, &s).unwrap();
        let Timeliness::RealTime { late_p50_s, late_p90_s, bursts, .. } = t else {
            panic!("{t:?}")
        };
        // Frames 1-3 of each 5 come 0-3 ms after the previous one, 33 ms apart in stamps.
        assert!((bursts - 0.6).abs() < 0.02, "{t:?}");
        // Behind the quickest (3 ms): 0, 0, 30, 64, 97 ms.
        assert!((late_p50_s - 0.0303).abs() < 1e-3 && (late_p90_s - 0.097).abs() < 1e-3, "{t:?}");
        assert!(t.late() && !t.on_time());
        // Steadily 60 ms late and never in a burst cannot be told from a clock offset:
        // the age alone is not judged.
        let (a, s) = paced(150, 1.7e9, |_| 0.060);
        assert!(timeliness(&a, &s).unwrap().on_time());
    }

    #[test]
    fn a_replay_at_another_rate_is_not_judged() {
        // Stamps 33 ms apart arriving 5 ms apart: `play --max`.
        let stamps: Vec<i64> =
            (0..60).map(|i| 1_600_000_000_000_000_000 + i * 33_333_333).collect();
        let arrivals: Vec<f64> = (0..60).map(|i| f64::from(i) * 0.005).collect();
        let t = timeliness(&arrivals, &stamps).unwrap();
        assert!(
            matches!(t, Timeliness::OtherRate { ratio } if (ratio - 6.67).abs() < 0.01),
            "{t:?}"
        );
        assert!(!t.late() && t.on_time());
        // Too few frames, or stamps that stand still: nothing said.
        assert_eq!(timeliness(&arrivals[..19], &stamps[..19]), None);
        assert_eq!(timeliness(&arrivals, &[7; 60]), None);
    }

    /// A live camera whose transport stalled and is catching up (a new user's stock
    /// reliable 1080p camera): 150 frames at 30 Hz whose delay falls from 1.5 s to 0 over
    /// the window, so their stamps advance ~1.4x as fast as they arrive.
    fn catching_up() -> (Vec<f64>, Vec<i64>) {
        let stamps: Vec<i64> =
            (0..150).map(|i| 1_700_000_000_000_000_000 + i * 33_333_333).collect();
        let arrivals =
            (0..150).map(|i| f64::from(i) / 30.0 + 1.5 * (1.0 - f64::from(i) / 149.0)).collect();
        (arrivals, stamps)
    }

    #[test]
    fn a_live_camera_catching_up_is_judged_late_and_a_recording_is_not() {
        let (a, s) = catching_up();
        // Without knowing it is live, the ratio reads as a replay at another rate: the
        // misfire a new user saw ("not judged: ... 1.62x").
        let t = timeliness(&a, &s).unwrap();
        assert!(matches!(t, Timeliness::OtherRate { ratio } if ratio > 1.25), "{t:?}");
        // Live (its stamps near the node's clock): judged, and late.
        let t = timeliness_of(&a, &s, true).unwrap();
        let Timeliness::RealTime { late_p50_s, .. } = t else { panic!("{t:?}") };
        assert!((late_p50_s - 0.75).abs() < 0.02, "{t:?}");
        assert!(t.late() && !t.on_time());

        // Through the monitor: the same arrivals with the ages a live camera has (its
        // delay), then with a recording's (three years old).
        let t0 = Instant::now();
        for (old, want_live) in [(0.0, true), (9.5e7, false)] {
            let mut m = DeliveryMonitor::default();
            for (&at, &stamp) in a.iter().zip(&s) {
                let at = t0 + Duration::from_secs_f64(MIN_SPAN.as_secs_f64() + at);
                m.image(at, stamp, 6_220_800);
                let i = (stamp - s[0]) as f64 / 33_333_333.0;
                m.image_age(at, old + 1.5 * (1.0 - i / 149.0));
            }
            m.started = Some(t0);
            let now = t0 + MIN_SPAN + Duration::from_secs_f64(a[149] + 0.01);
            let t = m.timeliness(now).unwrap();
            assert_eq!(matches!(t, Timeliness::RealTime { .. }), want_live, "{t:?}");
        }
    }

    #[test]
    fn the_window_forgets_old_arrivals() {
        let t0 = Instant::now();
        let mut m = DeliveryMonitor::default();
        for i in 0..40u32 {
            m.camera_info(t0 + Duration::from_millis(u64::from(i) * 100));
        }
        m.image(t0, 0, 10);
        let later = t0 + WINDOW + Duration::from_secs(5);
        // The camera_infos are older than the window and one stamp fits no period:
        // nothing to say.
        assert_eq!(m.assess(later), None);
    }
}
