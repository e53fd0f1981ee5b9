//! The node's own output rates and delay in the keys of NVIDIA's greenwave_monitor
//! (`docs/DESIGN_AND_IMPLEMENTATION.md` of NVIDIA-ISAAC-ROS/greenwave_monitor, its
//! *Diagnostics Contract*): one `/diagnostics` status per output topic, named after the
//! topic, with `frame_rate_node` (Hz, from the node's clock between publications),
//! `frame_rate_msg` (Hz, from the messages' header stamps), both the mean over the last
//! 300 intervals as greenwave's own window, `current_delay_from_realtime_ms` (the node's
//! clock minus the stamp of the last message, at its publication), `expected_frequency`
//! (`nan`: the node sets no expectation) and `tolerance` (greenwave's default, 5 %).
//! A topic with no publication since the previous status is `STALE`, as greenwave does.

use r2r::diagnostic_msgs::msg::{DiagnosticStatus, KeyValue};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// Intervals in a rate's window (greenwave's `filter_window_size`).
const WINDOW: usize = 300;
/// greenwave's default tolerance, percent.
const TOLERANCE_PERCENT: f64 = 5.0;

#[derive(Default)]
struct Rate {
    intervals: VecDeque<f64>,
    sum: f64,
    last: Option<f64>,
}

impl Rate {
    /// A new event at `t` seconds.
    fn add(&mut self, t: f64) {
        if let Some(last) = self.last.replace(t) {
            let dt = t - last;
            self.intervals.push_back(dt);
            self.sum += dt;
            if self.intervals.len() > WINDOW {
                self.sum -= self.intervals.pop_front().unwrap_or(0.0);
            }
        }
    }

    /// Hz: 1 / the mean interval (0 without one).
    fn hz(&self) -> f64 {
        if self.intervals.is_empty() || self.sum <= 0.0 {
            return 0.0;
        }
        self.intervals.len() as f64 / self.sum
    }
}

#[derive(Default)]
struct Topic {
    name: String,
    node: Rate,
    msg: Rate,
    delay_ms: Option<f64>,
    fresh: bool,
}

/// The output topics' rates and delay.
pub(super) struct Greenwave {
    topics: Mutex<Vec<Topic>>,
}

impl Greenwave {
    /// For the resolved output topics `names` (index i: [`Greenwave::published`]'s).
    pub(super) fn new(names: &[String]) -> Self {
        let topics = names.iter().map(|n| Topic { name: n.clone(), ..Topic::default() }).collect();
        Greenwave { topics: Mutex::new(topics) }
    }

    /// Topic `i` published a message stamped `stamp` at `now` on the node's clock (both
    /// since the epoch; `now` `None` while the clock has no time).
    pub(super) fn published(&self, i: usize, stamp: Duration, now: Option<Duration>) {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = topics.get_mut(i) else { return };
        if let Some(now) = now {
            t.node.add(now.as_secs_f64());
            t.delay_ms = Some((now.as_secs_f64() - stamp.as_secs_f64()) * 1e3);
        }
        t.msg.add(stamp.as_secs_f64());
        t.fresh = true;
    }

    /// One status per topic (`hardware_id`: the node's name); marks them not fresh.
    pub(super) fn statuses(&self, node: &str) -> Vec<DiagnosticStatus> {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        topics.iter_mut().map(|t| status(t, node)).collect()
    }
}

fn status(t: &mut Topic, node: &str) -> DiagnosticStatus {
    let fresh = std::mem::replace(&mut t.fresh, false);
    let kv = |key: &str, value: String| KeyValue { key: key.into(), value };
    let values = if fresh {
        vec![
            kv("frame_rate_node", format!("{:.6}", t.node.hz())),
            kv("frame_rate_msg", format!("{:.6}", t.msg.hz())),
            kv(
                "current_delay_from_realtime_ms",
                t.delay_ms.map_or("N/A".into(), |d| format!("{d:.6}")),
            ),
            kv("expected_frequency", "nan".into()),
            kv("tolerance", format!("{TOLERANCE_PERCENT:.6}")),
        ]
    } else {
        Vec::new()
    };
    let (level, message) = if fresh {
        (DiagnosticStatus::OK as u8, "OK")
    } else {
        (DiagnosticStatus::STALE as u8, "DIAGNOSTICS STALE")
    };
    DiagnosticStatus {
        level,
        name: t.name.clone(),
        message: message.into(),
        hardware_id: node.into(),
        values,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value<'a>(s: &'a DiagnosticStatus, key: &str) -> &'a str {
        &s.values.iter().find(|v| v.key == key).unwrap().value
    }

    #[test]
    fn rates_and_delay_in_greenwave_keys() {
        let g = Greenwave::new(&["/cam/tensor".into(), "/cam/tensor_ref".into()]);
        for i in 0..31u64 {
            // Stamps at 30 Hz, published every 1/30 s, 2 ms after the stamp.
            let stamp = Duration::from_nanos(1_000_000_000_000 + i * 33_333_333);
            g.published(1, stamp, Some(stamp + Duration::from_millis(2)));
        }
        let s = g.statuses("vp");
        assert_eq!(
            (s[0].name.as_str(), s[0].level),
            ("/cam/tensor", DiagnosticStatus::STALE as u8)
        );
        assert!(s[0].values.is_empty());
        assert_eq!((s[1].name.as_str(), s[1].message.as_str()), ("/cam/tensor_ref", "OK"));
        for key in ["frame_rate_node", "frame_rate_msg"] {
            let hz: f64 = value(&s[1], key).parse().unwrap();
            assert!((hz - 30.0).abs() < 1e-3, "{key} {hz}");
        }
        let delay: f64 = value(&s[1], "current_delay_from_realtime_ms").parse().unwrap();
        assert!((delay - 2.0).abs() < 1e-3, "{delay}");
        assert_eq!(value(&s[1], "expected_frequency"), "nan");
        assert_eq!(value(&s[1], "tolerance"), "5.000000");
        assert_eq!(g.statuses("vp")[1].level, DiagnosticStatus::STALE as u8, "nothing since");
    }
}
