//! The node's clock: ROS time (`RCL_ROS_TIME`), which is the system time, or, with
//! `use_sim_time: true`, the time last received on `/clock` (`ros2 bag play --clock`, a
//! simulator), through r2r's `TimeSource`.
//!
//! What follows this clock: `FrameTiming.age_us`, the `/diagnostics` period and the rates
//! in it, the `debug_image` rate limit, the rate limit of logged rejections, the stamps of
//! `/diagnostics` and `/parameter_events`. What does not: durations of work measured by the
//! node (stage times, `total_us`, the latency percentiles: the steady clock, since they
//! measure this machine, not the world) and the 0.3 s linger at shutdown (real time that
//! DDS needs). With sim time and no `/clock` message yet the clock reads 0 ("not
//! started", as `rclcpp::Clock::started()` says): frames are still processed, their
//! stamps are copied from the image as always, `age_us` is 0, and what is periodic waits
//! for the clock to move.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The node's ROS clock, shared by the tasks; cheap to clone.
#[derive(Clone)]
pub(crate) struct NodeClock {
    clock: Arc<Mutex<r2r::Clock>>,
    /// `use_sim_time` as set (the spin thread applies it to the node's time source).
    sim_time: Arc<AtomicBool>,
}

impl NodeClock {
    /// The clock of `node` (r2r's ROS clock, attached to the node's time source).
    pub(crate) fn of(node: &r2r::Node) -> Self {
        NodeClock { clock: node.get_ros_clock(), sim_time: Arc::new(AtomicBool::new(false)) }
    }

    /// Now on the node's clock, or `None` before it has a time (sim time, no `/clock` yet).
    pub(crate) fn now(&self) -> Option<Duration> {
        let now = self.clock.lock().unwrap_or_else(|p| p.into_inner()).get_now().ok()?;
        (!now.is_zero()).then_some(now)
    }

    /// Now as a message stamp (zero before the clock has a time).
    pub(crate) fn stamp(&self) -> r2r::builtin_interfaces::msg::Time {
        to_stamp(self.now().unwrap_or_default())
    }

    /// Ask for sim time on or off; [`NodeClock::apply`] makes it so.
    pub(crate) fn request_sim_time(&self, on: bool) {
        self.sim_time.store(on, Ordering::Release);
    }

    /// Whether sim time is requested.
    pub(crate) fn sim_time(&self) -> bool {
        self.sim_time.load(Ordering::Acquire)
    }

    /// Switch the node's time source to the requested state (`applied` is the state it is
    /// in; updated). Called by the thread that owns the node, between spins.
    pub(crate) fn apply(&self, node: &mut r2r::Node, applied: &mut bool) -> r2r::Result<()> {
        let want = self.sim_time();
        if want != *applied {
            let source = node.get_time_source();
            if want {
                source.enable_sim_time(node)?;
            } else {
                source.disable_sim_time();
            }
            *applied = want;
        }
        Ok(())
    }
}

/// A duration since the epoch as a message stamp.
pub(super) fn to_stamp(t: Duration) -> r2r::builtin_interfaces::msg::Time {
    r2r::builtin_interfaces::msg::Time {
        sec: i32::try_from(t.as_secs()).unwrap_or(i32::MAX),
        nanosec: t.subsec_nanos(),
    }
}

/// `now - stamp` in microseconds (negative when the stamp is ahead), 0 when the clock has
/// no time yet: `FrameTiming.age_us`.
pub(super) fn age_us(now: Option<Duration>, stamp: &r2r::builtin_interfaces::msg::Time) -> f32 {
    let Some(now) = now else {
        return 0.0;
    };
    let stamp_s = f64::from(stamp.sec) + f64::from(stamp.nanosec) * 1e-9;
    ((now.as_secs_f64() - stamp_s) * 1e6) as f32
}

/// At most one event per `period` of the node's clock (the debug image, logged
/// rejections). A clock without a time counts as 0; a clock that went backwards (a bag
/// looped with `--clock`) lets the next event through.
#[derive(Debug, Clone)]
pub(super) struct Throttle {
    period: Duration,
    last: Option<Duration>,
}

impl Throttle {
    /// One event per `period`.
    pub(super) fn new(period: Duration) -> Self {
        Throttle { period, last: None }
    }

    /// Change the period (a parameter changed); keeps the time of the last event.
    pub(super) fn set_period(&mut self, period: Duration) {
        self.period = period;
    }

    /// Whether an event may happen at `now`; if so, it is recorded as the last one.
    pub(super) fn ready(&mut self, now: Option<Duration>) -> bool {
        let now = now.unwrap_or_default();
        let ok = match self.last {
            None => true,
            Some(last) => now < last || now - last >= self.period,
        };
        if ok {
            self.last = Some(now);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_follows_the_given_clock_and_survives_jumps_back() {
        let s = Duration::from_secs;
        let mut t = Throttle::new(s(1));
        assert!(t.ready(Some(s(100))));
        assert!(!t.ready(Some(s(100) + Duration::from_millis(999))));
        assert!(t.ready(Some(s(101))));
        // The clock jumped back (a looped bag): the next event passes and restarts.
        assert!(t.ready(Some(s(5))));
        assert!(!t.ready(Some(s(5))));
        // No time yet: one event at "0", then none until the clock moves.
        let mut t = Throttle::new(s(1));
        assert!(t.ready(None));
        assert!(!t.ready(None));
        assert!(t.ready(Some(s(7))));
    }

    #[test]
    fn age_is_now_minus_stamp_and_zero_without_a_clock() {
        let stamp = r2r::builtin_interfaces::msg::Time { sec: 100, nanosec: 250_000_000 };
        assert_eq!(age_us(Some(Duration::from_millis(100_750)), &stamp), 500_000.0);
        assert_eq!(age_us(Some(Duration::from_secs(100)), &stamp), -250_000.0);
        assert_eq!(age_us(None, &stamp), 0.0);
    }
}
