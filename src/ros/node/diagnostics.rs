//! `/diagnostics`: one status named after the node, once per second of the node's clock
//! (with sim time: per simulated second; none while `/clock` stands still): the frame
//! counters and latency, the backend, each input (topic, QoS, publishers, delivery) and,
//! with 2+ inputs, each camera's counters and staleness; with 2+ inputs also one status
//! per camera (`<node>: camera <i>`), for aggregators; one per output topic in
//! greenwave_monitor's keys (`greenwave.rs`); one per consumer on the ready signal
//! (`<node>: consumer <name> (pid <pid>)`, also on `consumer_timing`).

use super::clock;
use super::lifecycle::State;
use super::shared::{lock, Shared};
use super::stats::{Counts, InputReport};
use crate::ros::dds::{profile_var, shipped_dds_profile};
use crate::transport::dds::KernelUdp;
use crate::transport::{delivery, Basis, Delivery, Timeliness};
use r2r::diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus, KeyValue};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Seconds of the node's clock between two `/diagnostics` statuses.
const DIAGNOSTICS_PERIOD: Duration = Duration::from_secs(1);

/// How often the diagnostics task looks at the node's clock (steady time).
const CLOCK_POLL: Duration = Duration::from_millis(20);

/// One status per [`DIAGNOSTICS_PERIOD`] of the node's clock (with sim time: per
/// simulated second; none while `/clock` stands still), rates over that clock's seconds.
pub(super) async fn publish_diagnostics(
    [publisher, consumer_timing]: [r2r::Publisher<DiagnosticArray>; 2],
    shared: Arc<Shared>,
    name: String,
) {
    let mut poll = tokio::time::interval(CLOCK_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut previous = Counts::default();
    let mut last: Option<Duration> = None;
    let mut warned = vec![Raised::default(); shared.inputs.len()];
    let mut camera_previous: Vec<u64> = Vec::new();
    // Which Fast DDS and which profile: fixed for the node's life.
    let (fastdds, profile) = crate::ros::dds::describe();
    let transport = [("Fast DDS".to_string(), fastdds), ("Fast DDS profile".to_string(), profile)];
    loop {
        poll.tick().await;
        let Some(now) = shared.clock.now() else {
            continue;
        };
        let Some(start) = last.filter(|&l| l <= now) else {
            // First time, or the clock went back (a looped bag): start a new window.
            last = Some(now);
            previous = shared.stats.counts();
            continue;
        };
        let seconds = (now - start).as_secs_f64();
        if seconds < DIAGNOSTICS_PERIOD.as_secs_f64() {
            continue;
        }
        last = Some(now);
        let (report, cameras) = input_report(&shared, &mut warned, &mut camera_previous, seconds);
        *lock(&shared.stats.input) = report;
        let backend = lock(&shared.backend).clone();
        let (mut status, counts) = shared.stats.status(&name, previous, seconds, &backend);
        previous = counts;
        status.values.extend(
            super::handoff::diagnostics(&shared)
                .into_iter()
                .chain(transport.iter().cloned())
                .map(|(key, value)| KeyValue { key, value }),
        );
        lifecycle_state(&shared, &mut status);
        let mut msg = DiagnosticArray { status: vec![status], ..Default::default() };
        msg.status.extend(cameras.into_iter().map(|c| c.status(&name)));
        msg.status.extend(shared.greenwave.statuses(&name));
        let consumers = super::handoff::consumer_statuses(&shared, &name);
        msg.status.extend(consumers.iter().cloned());
        msg.header.stamp = clock::to_stamp(now);
        if let Err(e) = publisher.publish(&msg) {
            r2r::log_warn!(&shared.logger, "publishing /diagnostics: {e}");
        }
        if !consumers.is_empty() {
            let timing = DiagnosticArray { header: msg.header.clone(), status: consumers };
            if let Err(e) = consumer_timing.publish(&timing) {
                r2r::log_warn!(&shared.logger, "publishing consumer_timing: {e}");
            }
        }
    }
}

/// The managed node's lifecycle state in `status`: a key, and while the node is not
/// active, level OK with the state as message (an inactive node waits for no frame).
fn lifecycle_state(shared: &Shared, status: &mut DiagnosticStatus) {
    let Some(id) = &shared.lifecycle else { return };
    let state = State::of_id(id.load(Ordering::Acquire)).unwrap_or(State::Unknown);
    status.values.push(KeyValue { key: "Lifecycle state".into(), value: state.label().into() });
    if state != State::Active {
        status.level = DiagnosticStatus::OK as u8;
        status.message = state.label().into();
    }
}

/// The input part of `/diagnostics`: topic, QoS, publishers, delivery, timeliness; and,
/// while large frames arrive at a fraction of the camera's rate or late and in bursts,
/// the warning (logged once when it is raised, once when it clears). With 2+ inputs, for each camera (keys
/// prefixed `Camera <i> `): the same, its rate over the window, received / published /
/// dropped / rejected frames and staleness, and `Batches published`; the warning names
/// the stale cameras (else a camera's delivery warning).
fn input_report(
    shared: &Shared,
    warned: &mut [Raised],
    previous: &mut Vec<u64>,
    seconds: f64,
) -> (InputReport, Vec<CameraStatus>) {
    if shared.inputs.len() < 2 {
        return (delivery_report(shared, 0, "", &mut warned[0]), Vec::new());
    }
    let mut cameras = Vec::new();
    let cams = lock(&shared.cameras).clone();
    previous.resize(cams.len(), 0);
    let mut values = vec![(
        "Batches published".to_string(),
        shared.sets_published.load(Ordering::Relaxed).to_string(),
    )];
    let mut warnings = Vec::new();
    let mut urgent = false;
    let mut stale = Vec::new();
    for (i, cam) in cams.iter().enumerate() {
        let prefix = format!("Camera {i} ");
        let report = delivery_report(shared, i, &prefix, &mut warned[i]);
        let rate = cam.counts.received.saturating_sub(previous[i]) as f64 / seconds.max(1e-9);
        previous[i] = cam.counts.received;
        let since = cam.last_arrival.map_or_else(
            || "no frame yet".to_string(),
            |t| format!("last frame {:.0} ms ago", t.elapsed().as_secs_f64() * 1e3),
        );
        let first = values.len();
        values.extend(report.values);
        values.extend([
            (format!("{prefix}rate (Hz)"), format!("{rate:.2}")),
            (format!("{prefix}frames received"), cam.counts.received.to_string()),
            (format!("{prefix}frames published"), cam.published.to_string()),
            (format!("{prefix}frames dropped"), cam.counts.dropped.to_string()),
            (format!("{prefix}frames rejected"), cam.rejected.to_string()),
            (
                format!("{prefix}state"),
                format!("{} ({since})", if cam.stale { "stale" } else { "live" }),
            ),
        ]);
        cameras.push(CameraStatus {
            index: i,
            topic: cam.topic.clone(),
            warning: if cam.stale {
                Some(format!(
                    "stale: no frame for stale_after_ms ({since}); slot padded and flagged invalid"
                ))
            } else {
                report.warning.clone()
            },
            values: values[first..]
                .iter()
                .map(|(k, v)| (k.strip_prefix(&prefix).unwrap_or(k).to_string(), v.clone()))
                .collect(),
        });
        if cam.stale {
            stale.push(format!("camera {i} ({})", cam.topic));
        }
        urgent |= report.urgent;
        warnings.extend(report.warning.map(|w| format!("camera {i} ({}): {w}", cam.topic)));
    }
    let urgent = urgent || !stale.is_empty();
    let warning = if stale.is_empty() {
        warnings.into_iter().next()
    } else {
        Some(format!(
            "stale: {} (no frame for stale_after_ms; slot padded and flagged invalid)",
            stale.join(", ")
        ))
    };
    (InputReport { values, warning, urgent }, cameras)
}

/// One camera of a node with 2+ inputs, as a status of its own (so that an aggregator
/// can place each camera: `<node>: camera <i>`, hardware id its topic, the node's
/// `Camera <i> ...` keys without the prefix, WARN while it is stale or its delivery
/// warns).
struct CameraStatus {
    index: usize,
    topic: String,
    warning: Option<String>,
    values: Vec<(String, String)>,
}

impl CameraStatus {
    fn status(self, node: &str) -> DiagnosticStatus {
        let (level, message) = match self.warning {
            Some(w) => (DiagnosticStatus::WARN as u8, w),
            None => (DiagnosticStatus::OK as u8, "live".to_string()),
        };
        DiagnosticStatus {
            level,
            name: format!("{node}: camera {}", self.index),
            message,
            hardware_id: self.topic,
            values: self
                .values
                .into_iter()
                .map(|(key, value)| r2r::diagnostic_msgs::msg::KeyValue { key, value })
                .collect(),
        }
    }
}

/// The input warnings raised for one camera (each logged once when raised, once when
/// cleared).
#[derive(Debug, Default, Clone, Copy)]
struct Raised {
    /// Large frames are lost before the node.
    lost: bool,
    /// Frames reach the node late, in bursts (a transport that repairs fragments).
    late: bool,
}

/// One input's topic, QoS, publishers, delivery and timeliness (keys after `prefix`),
/// and its warning while large frames are lost before the node or arrive late.
fn delivery_report(
    shared: &Shared,
    index: usize,
    prefix: &str,
    raised: &mut Raised,
) -> InputReport {
    if let Some(report) = pipeline_report(shared, index, prefix) {
        return report;
    }
    let (topic, transport, qos, publishers, best_effort) = {
        let st = lock(&shared.inputs[index]);
        (st.topic.clone(), st.transport, st.qos.clone(), st.publishers, st.best_effort)
    };
    let (delivery, timeliness, largest, images_recently) = {
        let mut st = lock(&shared.inputs[index]);
        let now = Instant::now();
        let d = st.monitor.assess(now);
        let t = st.monitor.timeliness(now);
        (d, t, st.monitor.largest(), st.monitor.images_recently(now))
    };
    let transport = match transport.unwrap_or(crate::config::Transport::Raw) {
        crate::config::Transport::Raw => "raw (sensor_msgs/Image)",
        crate::config::Transport::Compressed => {
            "compressed (sensor_msgs/CompressedImage: JPEG and PNG decoded by the backend, \
             H.264 and H.265 by the input's video decoder)"
        }
        crate::config::Transport::Foxglove => {
            "foxglove (foxglove_msgs/CompressedVideo, decoded in the node by GStreamer)"
        }
        crate::config::Transport::Ffmpeg => {
            "ffmpeg (ffmpeg_image_transport_msgs/FFMPEGPacket, decoded in the node by GStreamer)"
        }
    };
    let mut values = vec![
        (format!("{prefix}Input topic"), topic.clone()),
        (format!("{prefix}Input transport"), transport.to_string()),
        (format!("{prefix}Input QoS"), qos),
        (format!("{prefix}Input publishers"), publishers.to_string()),
    ];
    if let Some(feed) = lock(&shared.inputs[index]).video.as_ref() {
        values.extend(video_values(&feed.report(), prefix));
    }
    let input = Described { shared, topic: &topic, best_effort };
    let kernel = KernelUdp::read();
    match delivery {
        Some(d) => {
            values.push((format!("{prefix}Input delivery"), describe_delivery(&d)));
            let losing = d.fraction < delivery::RAISE_BELOW
                && (d.largest_bytes >= delivery::LARGE_SAMPLE || d.largest_bytes == 0);
            if !raised.lost && losing {
                raised.lost = true;
                input.warn_lost(&d, &kernel);
            } else if raised.lost && d.fraction >= delivery::CLEAR_ABOVE {
                raised.lost = false;
                r2r::log_info!(&shared.logger, "input: frames arrive at the camera's rate again");
            }
        }
        // Not enough to judge this second (a late stamp in the fit): a raised warning
        // stays until frames are seen arriving at the camera's rate, or no image came
        // for STAMP_WINDOW (the camera is gone).
        None if raised.lost && !images_recently => {
            raised.lost = false;
            r2r::log_info!(&shared.logger, "input: no image arrives any more; warning cleared");
        }
        None => {}
    }
    if let Some(t) = timeliness {
        values.push((format!("{prefix}Input timeliness"), describe_timeliness(&t)));
        if !raised.late && t.late() {
            raised.late = true;
            input.warn_late(&t, largest, &kernel);
        } else if raised.late && t.on_time() {
            raised.late = false;
            r2r::log_info!(&shared.logger, "input: frames arrive on time again");
        }
    } else if raised.late && !images_recently {
        raised.late = false;
        r2r::log_info!(&shared.logger, "input: no image arrives any more; warning cleared");
    }
    if (raised.lost || raised.late) && largest >= delivery::LARGE_SAMPLE {
        if let Some(k) = kernel {
            values.push((format!("{prefix}Kernel UDP settings"), k.describe()));
        }
    }
    let warning = input.summary(raised, delivery.as_ref(), timeliness.as_ref());
    // Late frames come in bursts, and a burst's frames replace each other in the node's
    // keep-latest slot: the transport is the cause of those drops, so it is named first.
    InputReport { values, warning, urgent: raised.late && !raised.lost }
}

/// A video input's keys (after `prefix`): its decoder, the packets by what became of
/// them, the frames decoded, gaps and decoder faults, the last problem. Nothing until its
/// first packet (a `compressed` input of JPEG or PNG has none).
fn video_values(r: &crate::capture::VideoReport, prefix: &str) -> Vec<(String, String)> {
    let c = &r.counts;
    if c.received == 0 {
        return Vec::new();
    }
    let decoder = match &r.decoder {
        Some(d) => {
            let size = r.size.map(|(w, h)| format!(" {w}x{h}")).unwrap_or_default();
            format!("{}{size}: {} ({})", d.codec, d.decoder, d.why)
        }
        None => "none yet (waiting for a key frame)".to_string(),
    };
    let refused: Vec<String> = c.refused.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let mut values = vec![
        (format!("{prefix}Input video decoder"), decoder),
        (
            format!("{prefix}Input video packets"),
            format!(
                "{} received: {} decoded, {} waiting for a key frame, {} refused{}",
                c.received,
                c.decoding,
                c.waiting,
                c.refused.values().sum::<u64>(),
                if refused.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", refused.join(", "))
                }
            ),
        ),
        (
            format!("{prefix}Input video frames"),
            format!(
                "{} out of the decoder; {} gaps (lost packets), {} decoder faults, {} decoder \
                 starts{}",
                c.frames,
                c.gaps,
                c.faults,
                c.starts,
                if r.waiting { "; waiting for a key frame" } else { "" }
            ),
        ),
    ];
    if let Some(p) = &r.last_problem {
        values.push((format!("{prefix}Input video last problem"), p.clone()));
    }
    values
}

/// How long a pipeline input's last fault keeps its status at WARN after it runs again.
const PIPELINE_FAULT_SHOWN: Duration = Duration::from_secs(10);

/// A pipeline input's keys (after `prefix`): its description, whether it runs, its
/// faults and restarts, the last fault, how its frames reach the kernels; WARN while it
/// is down or within [`PIPELINE_FAULT_SHOWN`] of a fault. `None` for a topic input.
fn pipeline_report(shared: &Shared, index: usize, prefix: &str) -> Option<InputReport> {
    let backend = lock(&shared.backend).name.clone();
    let st = lock(&shared.inputs[index]);
    let p = st.pipeline.as_ref()?;
    let last = p.last_fault.as_ref().map(|(what, at)| (what.clone(), at.elapsed()));
    let mut values = vec![
        (format!("{prefix}Input pipeline"), st.topic.clone()),
        (
            format!("{prefix}Input pipeline state"),
            match (p.running, p.live) {
                (false, _) => "restarting".to_string(),
                (true, true) => "running (live: stamps are capture times)".to_string(),
                (true, false) => "running (not live: stamps are arrival times)".to_string(),
            },
        ),
        (format!("{prefix}Input pipeline faults"), p.faults.to_string()),
        (format!("{prefix}Input pipeline restarts"), p.restarts.to_string()),
        (
            format!("{prefix}Input image_raw published"),
            format!("{} (only while someone subscribes)", p.raw_published),
        ),
        (format!("{prefix}Input frame copies"), p.copies(&backend)),
    ];
    if let Some((what, ago)) = &last {
        values.push((
            format!("{prefix}Input last fault"),
            format!("{what} ({:.1} s ago)", ago.as_secs_f64()),
        ));
    }
    let warning = match &last {
        Some((what, _)) if !p.running => Some(format!("pipeline down, restarting: {what}")),
        Some((what, ago)) if *ago < PIPELINE_FAULT_SHOWN => {
            Some(format!("pipeline restarted after: {what}"))
        }
        _ => None,
    };
    Some(InputReport { values, warning, urgent: !p.running })
}

/// The `Input delivery` value.
fn describe_delivery(d: &Delivery) -> String {
    format!(
        "{:.1} of {:.1} frames/s arrive ({:.0} %; camera rate from {})",
        d.arrived_hz,
        d.camera_hz,
        100.0 * d.fraction,
        basis_name(d.basis)
    )
}

/// Where the camera's rate came from, as the texts name it.
fn basis_name(basis: Basis) -> &'static str {
    match basis {
        Basis::CameraInfo => "camera_info",
        Basis::Stamps => "image stamps",
    }
}

/// One input as its transport warnings name it.
struct Described<'a> {
    shared: &'a Shared,
    topic: &'a str,
    best_effort: bool,
}

impl Described<'_> {
    fn kind(&self) -> &'static str {
        if self.best_effort {
            "best-effort"
        } else {
            "reliable"
        }
    }

    /// The fix both warnings give: the camera driver with the shipped profile, under the
    /// name this Fast DDS reads.
    fn profile(&self) -> String {
        let path = shipped_dds_profile().map_or_else(
            || "config/fastdds_large_frames.xml".to_string(),
            |p| p.display().to_string(),
        );
        format!("{}={path}", profile_var())
    }

    /// Across machines (IP fragments), what ROS 2's DDS tuning guide raises in the kernel.
    fn across_machines(kernel: &Option<KernelUdp>) -> String {
        match kernel.map(|k| k.advice()) {
            Some(a) if !a.is_empty() => format!(
                " Across machines (IP fragments), ROS 2's DDS tuning guide also raises the \
                 kernel's limits: {a}"
            ),
            _ => String::new(),
        }
    }

    /// The log line when large frames start to be lost before the node.
    fn warn_lost(&self, d: &Delivery, kernel: &Option<KernelUdp>) {
        let cause = if self.best_effort {
            "Large best-effort samples that do not fit the camera's Fast DDS \
             shared-memory segment go as UDP fragments, and one lost fragment loses \
             the frame"
        } else {
            "Large reliable samples that do not fit the camera's Fast DDS \
             shared-memory segment go as UDP fragments; while lost fragments are \
             repaired, the camera's writer history fills and newer frames replace \
             the unrepaired ones"
        };
        let basis = basis_name(d.basis);
        r2r::log_warn!(
            &self.shared.logger,
            "frames are lost before they reach the node: {:.1} of the camera's ~{:.1} \
             frames/s arrive on {} ({:.1} MB {} images, camera rate from {basis}). {cause}. \
             Fix: start the camera driver with {}{}.{}",
            d.arrived_hz,
            d.camera_hz,
            self.topic,
            d.largest_bytes as f64 / 1e6,
            self.kind(),
            self.profile(),
            if self.best_effort {
                ", or make it publish reliable (input_qos auto then subscribes reliable)"
            } else {
                ""
            },
            Self::across_machines(kernel)
        );
    }

    /// The log line when frames start to arrive late, in bursts.
    fn warn_late(&self, t: &Timeliness, largest: usize, kernel: &Option<KernelUdp>) {
        let Timeliness::RealTime { late_p50_s, late_p90_s, bursts, .. } = *t else {
            return;
        };
        r2r::log_warn!(
            &self.shared.logger,
            "frames reach the node late: over the last {} s the median frame arrived \
             {:.0} ms and one in ten {:.0} ms later than the quickest, {:.0} % of them \
             in bursts, on {} ({:.1} MB {} images). The camera's transport \
             is the bottleneck: samples that do not fit its Fast DDS shared-memory \
             segment go as UDP fragments, and every repair of a lost fragment holds \
             back the frames behind it. Fix: start the camera driver with \
             {} (shared memory on one machine).{}",
            delivery::TIMELY_WINDOW.as_secs(),
            late_p50_s * 1e3,
            late_p90_s * 1e3,
            100.0 * bursts,
            self.topic,
            largest as f64 / 1e6,
            self.kind(),
            self.profile(),
            Self::across_machines(kernel)
        );
    }

    /// The input's part of the status message while a warning is raised.
    fn summary(
        &self,
        raised: &Raised,
        delivery: Option<&Delivery>,
        timeliness: Option<&Timeliness>,
    ) -> Option<String> {
        let (kind, reliable) = (self.kind(), if self.best_effort { " or reliable" } else { "" });
        if raised.lost {
            return Some(match delivery {
                Some(d) => format!(
                    "frames lost before the node: {:.1} of ~{:.1} frames/s arrive (large {kind} \
                     images; run the camera with config/fastdds_large_frames.xml{reliable})",
                    d.arrived_hz, d.camera_hz
                ),
                None => format!(
                    "frames lost before the node (large {kind} images; run the camera with \
                     config/fastdds_large_frames.xml{reliable})"
                ),
            });
        }
        if !raised.late {
            return None;
        }
        Some(match timeliness {
            Some(Timeliness::RealTime { late_p90_s, bursts, .. }) => format!(
                "camera transport too slow: frames arrive up to {:.0} ms late (p90), {:.0} % in \
                 bursts (repaired UDP fragments; run the camera with \
                 config/fastdds_large_frames.xml)",
                late_p90_s * 1e3,
                100.0 * bursts
            ),
            _ => "camera transport too slow: frames arrive late, in bursts (run the camera \
                  with config/fastdds_large_frames.xml)"
                .to_string(),
        })
    }
}

/// The `Input timeliness` value.
fn describe_timeliness(t: &Timeliness) -> String {
    match *t {
        Timeliness::RealTime { late_p50_s, late_p90_s, bursts, frames, .. } => format!(
            "behind the quickest frame: median {:.1} ms, p90 {:.1} ms; {:.0} % in bursts \
             ({frames} frames)",
            late_p50_s * 1e3,
            late_p90_s * 1e3,
            100.0 * bursts
        ),
        Timeliness::OtherRate { ratio } => format!(
            "not judged: the stamps advance {ratio:.2}x as fast as frames arrive (a replay \
             at another rate)"
        ),
    }
}

/// A last status, ERROR, saying why the node exits (`reason`).
pub(super) fn publish_exit(
    publisher: &r2r::Publisher<DiagnosticArray>,
    shared: &Shared,
    name: &str,
    reason: &str,
) {
    let backend = lock(&shared.backend).clone();
    let (mut status, _) = shared.stats.status(name, shared.stats.counts(), 1.0, &backend);
    status.level = DiagnosticStatus::ERROR as u8;
    status.message = format!("exiting: {reason}");
    let mut msg = DiagnosticArray { status: vec![status], ..Default::default() };
    msg.header.stamp = shared.clock.stamp();
    if let Err(e) = publisher.publish(&msg) {
        r2r::log_warn!(&shared.logger, "publishing /diagnostics: {e}");
    }
}
