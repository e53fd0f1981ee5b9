//! Frame accounting and the `/diagnostics` status built from it (pure: unit-tested
//! without ROS types beyond the message structs).
//!
//! Every frame the node receives ends up in exactly one counter: published, dropped
//! (replaced by a newer frame before processing), rejected (invalid input) or failed
//! (a backend or publish error); a frame being processed is in none yet.

use r2r::diagnostic_msgs::msg::{DiagnosticStatus, KeyValue};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Counters shared by the ingest task, the processing thread and the diagnostics timer.
#[derive(Default)]
pub struct Stats {
    /// Frames taken from the subscriptions (counted by the frame-set former).
    pub received: AtomicU64,
    /// Tensors published.
    pub published: AtomicU64,
    /// Frames replaced by a newer one before processing, or never put in a set.
    pub dropped: AtomicU64,
    /// Frames rejected as invalid (bad header, unsupported encoding, roi outside, ...).
    pub rejected: AtomicU64,
    /// Frames lost to a backend or publish error.
    pub failed: AtomicU64,
    /// Backend failures `gpu_failure_policy` recovered from (not frames: the frame that
    /// failed was run again and is counted where it ended).
    pub gpu_failures: AtomicU64,
    /// Sets submitted to the backend before the previous set was handed to the
    /// publishing thread (their staging, upload and GPU work overlapped its finish or
    /// its publishing; a backend with two sets in flight, under load).
    pub overlapped: AtomicU64,
    /// Of `dropped`: frames of sets for `tensor_ref` alone that found no free shared
    /// block.
    pub dropped_no_block: AtomicU64,
    /// Window since the last diagnostics report.
    window: Mutex<Window>,
    /// What the input looks like (topic, QoS, delivery), set before each report.
    pub input: Mutex<InputReport>,
    /// Of `rejected` and `failed`: compressed frames that did not decode, by cause
    /// (`DecodeError::kind`).
    undecodable: Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

/// The input part of the status: key/values, and a warning when frames are lost before
/// they reach the node.
#[derive(Debug, Clone, Default)]
pub struct InputReport {
    /// Extra key/values (input topic, QoS, publishers, delivery).
    pub values: Vec<(String, String)>,
    /// Set while frames are being lost before the node: the status message (WARN).
    pub warning: Option<String>,
    /// The warning outranks dropped frames in the status message (a stale camera of a
    /// batching node: its drops are the other cameras' frames replaced while waiting; a
    /// late camera transport: its bursts replace each other in the keep-latest slot).
    pub urgent: bool,
}

#[derive(Default)]
struct Window {
    /// Receive -> publish latencies of the frames published in the window, ms.
    latencies_ms: Vec<f32>,
    last_rejection: Option<String>,
    last_failure: Option<String>,
}

/// A snapshot of the counters, for differences between reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// See [`Stats::received`].
    pub received: u64,
    /// See [`Stats::published`].
    pub published: u64,
    /// See [`Stats::dropped`].
    pub dropped: u64,
    /// See [`Stats::rejected`].
    pub rejected: u64,
    /// See [`Stats::failed`].
    pub failed: u64,
    /// See [`Stats::gpu_failures`].
    pub gpu_failures: u64,
    /// See [`Stats::overlapped`].
    pub overlapped: u64,
    /// See [`Stats::dropped_no_block`].
    pub dropped_no_block: u64,
}

/// What the diagnostics status says about the backend.
#[derive(Debug, Clone, Default)]
pub struct BackendInfo {
    /// "cpu" or "cuda".
    pub name: String,
    /// Device description (CPU threads, GPU name).
    pub device: String,
    /// Extra key/values from the backend (GPU clock, memory mode, ...).
    pub details: Vec<(String, String)>,
    /// Why `backend: auto` fell back to the CPU, if it did.
    pub fallback: Option<String>,
    /// The last backend failure while running (the error, what `gpu_failure_policy` did).
    pub gpu_failure: Option<(String, String)>,
}

impl Stats {
    /// Snapshot of the counters.
    pub fn counts(&self) -> Counts {
        Counts {
            received: self.received.load(Ordering::Relaxed),
            published: self.published.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            gpu_failures: self.gpu_failures.load(Ordering::Relaxed),
            overlapped: self.overlapped.load(Ordering::Relaxed),
            dropped_no_block: self.dropped_no_block.load(Ordering::Relaxed),
        }
    }

    /// A tensor was published `latency_ms` after its frame arrived.
    pub fn published(&self, latency_ms: f32) {
        self.published.fetch_add(1, Ordering::Relaxed);
        self.lock().latencies_ms.push(latency_ms);
    }

    /// A frame was rejected as invalid.
    pub fn rejected(&self, reason: String) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        self.lock().last_rejection = Some(reason);
    }

    /// A compressed frame did not decode, for `cause` (counted rejected or failed too).
    pub fn undecodable(&self, cause: &'static str) {
        *self.undecodable.lock().unwrap_or_else(|p| p.into_inner()).entry(cause).or_default() += 1;
    }

    /// The compressed frames that did not decode, by cause: `truncated: 2, corrupt: 1`
    /// (empty when none).
    pub fn undecodable_by_cause(&self) -> String {
        let causes = self.undecodable.lock().unwrap_or_else(|p| p.into_inner());
        causes.iter().map(|(k, n)| format!("{k}: {n}")).collect::<Vec<_>>().join(", ")
    }

    /// A frame was lost to a backend or publish error.
    pub fn failed(&self, reason: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.lock().last_failure = Some(reason);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn input_report(&self) -> InputReport {
        self.input.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The diagnostics status for the window since `previous` (`seconds` long), and the
    /// counts to pass as `previous` next time.
    pub fn status(
        &self,
        name: &str,
        previous: Counts,
        seconds: f64,
        backend: &BackendInfo,
    ) -> (DiagnosticStatus, Counts) {
        let now = self.counts();
        let window = self.lock();
        let last_failure = window.last_failure.clone();
        let input = self.input_report();
        let active = active_conditions((&now, &previous), seconds, backend, &input);
        let (level, message) = merge_summary(active).unwrap_or_else(|| {
            let quiet = if now.received == 0 { "waiting for images" } else { "ok" };
            (DiagnosticStatus::OK as u8, quiet.to_string())
        });
        let published = now.published.saturating_sub(previous.published);
        let mut values = vec![kv(
            "Actual frequency (Hz)",
            format!("{:.2}", published as f64 / seconds.max(1e-9)),
        )];
        values.extend(self.count_values(&now, window));
        values.extend(backend_values(backend));
        values.extend(input.values.iter().map(|(k, v)| kv(k, v.clone())));
        if let Some(reason) = &backend.fallback {
            values.push(kv("Backend fallback reason", reason.clone()));
        }
        if let Some((reason, action)) = &backend.gpu_failure {
            values.push(kv("GPU failures", now.gpu_failures.to_string()));
            values.push(kv("Last GPU failure", reason.clone()));
            values.push(kv("GPU failure action", action.clone()));
        }
        if let Some(f) = last_failure {
            values.push(kv("Last failure", f));
        }
        let status = DiagnosticStatus {
            level,
            name: name.to_string(),
            message,
            hardware_id: backend.device.clone(),
            values,
        };
        (status, now)
    }

    /// The counters' values of a status, the window's latencies taken.
    fn count_values(&self, now: &Counts, mut window: MutexGuard<'_, Window>) -> Vec<KeyValue> {
        let mut lat = std::mem::take(&mut window.latencies_ms);
        lat.sort_by(f32::total_cmp);
        let last_rejection = window.last_rejection.clone().unwrap_or_default();
        drop(window);
        vec![
            kv("Frames received", now.received.to_string()),
            kv("Frames published", now.published.to_string()),
            kv("Frames dropped (queue)", now.dropped.to_string()),
            kv("Frames rejected (invalid)", now.rejected.to_string()),
            kv("Frames failed (error)", now.failed.to_string()),
            kv("Sets overlapped", now.overlapped.to_string()),
            kv("Frames dropped (no free shared block)", now.dropped_no_block.to_string()),
            kv("Last rejection reason", last_rejection),
            kv("Compressed frames undecodable (by cause)", self.undecodable_by_cause()),
            kv("Latency p50 (ms)", percentile(&lat, 50.0)),
            kv("Latency p99 (ms)", percentile(&lat, 99.0)),
        ]
    }
}

/// The backend's values of a status: its name, device and details.
fn backend_values(backend: &BackendInfo) -> Vec<KeyValue> {
    let mut values =
        vec![kv("Backend", backend.name.clone()), kv("Device", backend.device.clone())];
    values.extend(backend.details.iter().map(|(k, v)| kv(k, v.clone())));
    values
}

/// Every condition active in the window `(now, previous)`, in the order of urgency; the
/// summary merges them as diagnostic_updater's `mergeSummary` does (the highest level, the
/// messages joined with "; "), most severe first: one warning never hides another (rqt's
/// monitor shows only the summary).
fn active_conditions(
    (now, previous): (&Counts, &Counts),
    seconds: f64,
    backend: &BackendInfo,
    input: &InputReport,
) -> Vec<(u8, String)> {
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let (dropped, rejected, failed, gpu_failures) = (
        d(now.dropped, previous.dropped),
        d(now.rejected, previous.rejected),
        d(now.failed, previous.failed),
        d(now.gpu_failures, previous.gpu_failures),
    );
    let (error, warn) = (DiagnosticStatus::ERROR as u8, DiagnosticStatus::WARN as u8);
    let mut active: Vec<(u8, String)> = Vec::new();
    if rejected > 0 {
        active.push((
            error,
            format!("rejecting invalid frames ({rejected} in the last {seconds:.0} s)"),
        ));
    }
    if failed > 0 {
        active.push((error, format!("frames failed ({failed} in the last {seconds:.0} s)")));
    }
    if let (true, Some((_, action))) = (gpu_failures > 0, &backend.gpu_failure) {
        active.push((
            warn,
            format!("GPU failure ({gpu_failures} in the last {seconds:.0} s): {action}"),
        ));
    }
    if let (true, Some(w)) = (input.urgent, &input.warning) {
        active.push((warn, w.clone()));
    }
    let no_block = d(now.dropped_no_block, previous.dropped_no_block);
    if no_block > 0 {
        active.push((
            warn,
            format!(
                "dropping frames: no free shared block for tensor_ref ({no_block} in the \
                 last {seconds:.0} s): its consumers hold them all; release frames sooner \
                 or raise shared_pool_size"
            ),
        ));
    }
    if dropped > 0 {
        active.push((
            warn,
            format!("dropping frames: {dropped} replaced by newer ones in the last {seconds:.0} s"),
        ));
    }
    if let (false, Some(w)) = (input.urgent, &input.warning) {
        active.push((warn, w.clone()));
    }
    if let (Some((_, action)), "cpu") = (&backend.gpu_failure, backend.name.as_str()) {
        active.push((warn, format!("running on the CPU after a GPU failure: {action}")));
    }
    if backend.fallback.is_some() {
        active.push((warn, "no usable GPU: running on the CPU backend".to_string()));
    }
    active
}

/// The summary of the active conditions `(level, message)` (in order of urgency): the
/// highest level, and every message, the most severe first (a stable order within a level),
/// joined with "; " as diagnostic_updater's `mergeSummary` joins them. None when none is
/// active.
fn merge_summary(mut active: Vec<(u8, String)>) -> Option<(u8, String)> {
    active.sort_by_key(|(level, _)| std::cmp::Reverse(*level));
    let level = active.first()?.0;
    Some((level, active.into_iter().map(|(_, m)| m).collect::<Vec<_>>().join("; ")))
}

fn kv(key: &str, value: String) -> KeyValue {
    KeyValue { key: key.to_string(), value }
}

/// Nearest-rank percentile of sorted values, formatted in ms; "" with no samples.
fn percentile(sorted: &[f32], q: f64) -> String {
    crate::percentile::nearest_rank(sorted, q).map_or_else(String::new, |v| format!("{v:.3}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value<'a>(s: &'a DiagnosticStatus, key: &str) -> &'a str {
        s.values.iter().find(|v| v.key == key).map(|v| v.value.as_str()).unwrap_or("<missing>")
    }

    #[test]
    fn levels_follow_the_window() {
        let stats = Stats::default();
        let info = BackendInfo {
            name: "cpu".into(),
            device: "CPU, 2 threads".into(),
            ..Default::default()
        };
        let (s, prev) = stats.status("vp", Counts::default(), 1.0, &info);
        assert_eq!(
            (s.level, s.message.as_str()),
            (DiagnosticStatus::OK as u8, "waiting for images")
        );
        for ms in [1.0, 2.0, 3.0, 4.0] {
            stats.received.fetch_add(1, Ordering::Relaxed);
            stats.published(ms);
        }
        let (s, prev) = stats.status("vp", prev, 2.0, &info);
        assert_eq!(s.level, DiagnosticStatus::OK as u8);
        assert_eq!(value(&s, "Actual frequency (Hz)"), "2.00");
        // Nearest rank: p50 of [1,2,3,4] is the 2nd value, p99 the 4th.
        assert_eq!(
            (value(&s, "Latency p50 (ms)"), value(&s, "Latency p99 (ms)")),
            ("2.000", "4.000")
        );
        stats.dropped.fetch_add(2, Ordering::Relaxed);
        let (s, prev) = stats.status("vp", prev, 1.0, &info);
        assert_eq!(s.level, DiagnosticStatus::WARN as u8);
        assert_eq!(value(&s, "Frames dropped (queue)"), "2");
        stats.rejected("encoding `8UC3` is not supported".into());
        let (s, prev) = stats.status("vp", prev, 1.0, &info);
        assert_eq!(s.level, DiagnosticStatus::ERROR as u8);
        assert_eq!(value(&s, "Last rejection reason"), "encoding `8UC3` is not supported");
        // A quiet window after that is OK again, totals stay.
        let (s, _) = stats.status("vp", prev, 1.0, &info);
        assert_eq!(s.level, DiagnosticStatus::OK as u8);
        assert_eq!(value(&s, "Frames rejected (invalid)"), "1");
        // Frames lost before the node: WARN with the reason, keys listed.
        *stats.input.lock().unwrap() = InputReport {
            values: vec![("Input delivery".into(), "0.7 of 30.0 frames/s".into())],
            warning: Some("frames lost before the node".into()),
            urgent: false,
        };
        let (s, prev) = stats.status("vp", prev, 1.0, &info);
        assert_eq!(
            (s.level, s.message.as_str()),
            (DiagnosticStatus::WARN as u8, "frames lost before the node")
        );
        assert_eq!(value(&s, "Input delivery"), "0.7 of 30.0 frames/s");
        *stats.input.lock().unwrap() = InputReport::default();
        let (s, _) = stats.status("vp", prev, 1.0, &info);
        assert_eq!(s.level, DiagnosticStatus::OK as u8);
        let fallback = BackendInfo { fallback: Some("no GPU".into()), ..info.clone() };
        let (s, _) = stats.status("vp", stats.counts(), 1.0, &fallback);
        assert_eq!(s.level, DiagnosticStatus::WARN as u8);
        assert_eq!(value(&s, "Backend fallback reason"), "no GPU");
    }

    #[test]
    fn every_active_warning_reaches_the_summary_most_severe_first() {
        // As a new user saw it: `backend: auto` on a machine without a GPU and a stock
        // reliable 1080p camera arriving late; the fallback's WARN hid the transport's.
        let stats = Stats::default();
        let auto = BackendInfo {
            name: "cpu".into(),
            device: "CPU, 2 threads".into(),
            fallback: Some("no usable GPU".into()),
            ..Default::default()
        };
        stats.received.fetch_add(3, Ordering::Relaxed);
        *stats.input.lock().unwrap() = InputReport {
            values: vec![],
            warning: Some("camera transport too slow: frames arrive up to 240 ms late".into()),
            urgent: false,
        };
        let (s, prev) = stats.status("vp", Counts::default(), 1.0, &auto);
        assert_eq!(
            (s.level, s.message.as_str()),
            (
                DiagnosticStatus::WARN as u8,
                "camera transport too slow: frames arrive up to 240 ms late; no usable GPU: \
                 running on the CPU backend"
            )
        );
        // An error comes first and sets the level; the warnings stay in the message.
        stats.rejected("encoding `8UC3` is not supported".into());
        let (s, _) = stats.status("vp", prev, 1.0, &auto);
        assert_eq!(s.level, DiagnosticStatus::ERROR as u8);
        assert_eq!(
            s.message,
            "rejecting invalid frames (1 in the last 1 s); camera transport too slow: frames \
             arrive up to 240 ms late; no usable GPU: running on the CPU backend"
        );
        assert_eq!(merge_summary(vec![]), None);
        let order = merge_summary(vec![(1, "a".into()), (2, "b".into()), (1, "c".into())]);
        assert_eq!(order, Some((2, "b; a; c".into())));
    }

    #[test]
    fn gpu_failures_warn_with_the_reason() {
        let stats = Stats::default();
        let failure = Some((
            "CUDA: launching `x`: CUDA_ERROR_ILLEGAL_ADDRESS".to_string(),
            "gpu_failure_policy retry: rebuilt the cuda backend (attempt 1 of 3)".to_string(),
        ));
        let cuda = BackendInfo {
            name: "cuda".into(),
            device: "H200".into(),
            gpu_failure: failure.clone(),
            ..Default::default()
        };
        stats.received.fetch_add(1, Ordering::Relaxed);
        stats.published(1.0);
        stats.gpu_failures.fetch_add(1, Ordering::Relaxed);
        let (s, prev) = stats.status("vp", Counts::default(), 1.0, &cuda);
        assert_eq!(s.level, DiagnosticStatus::WARN as u8);
        assert_eq!(
            s.message,
            "GPU failure (1 in the last 1 s): gpu_failure_policy retry: rebuilt the cuda \
             backend (attempt 1 of 3)"
        );
        assert_eq!(
            value(&s, "Last GPU failure"),
            "CUDA: launching `x`: CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        assert_eq!(value(&s, "GPU failures"), "1");
        // Rebuilt on the GPU: the next quiet window is OK again, the keys stay.
        let (s, prev) = stats.status("vp", prev, 1.0, &cuda);
        assert_eq!((s.level, value(&s, "GPU failures")), (DiagnosticStatus::OK as u8, "1"));
        // On the CPU after a failure: WARN for as long as it lasts.
        let cpu = BackendInfo { name: "cpu".into(), gpu_failure: failure, ..cuda };
        let (s, _) = stats.status("vp", prev, 1.0, &cpu);
        assert_eq!(s.level, DiagnosticStatus::WARN as u8);
        assert!(s.message.starts_with("running on the CPU after a GPU failure"), "{}", s.message);
    }
}
