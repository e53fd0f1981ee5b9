//! `vision_preproc play`: publish a bag's images (and camera_info) as a ROS 2 publisher,
//! with the recorded timing — the playback side of a live replay, for machines without
//! `ros2 bag play`. Messages are published as recorded (serialized bytes, original
//! header stamps); each is checked to decode first, so a corrupt one is skipped with its
//! reason instead of being sent. A `sensor_msgs/CompressedImage` topic is published on
//! `<image topic>/compressed`, where image_transport's `compressed` subscribers (and the
//! node with `image_transport: compressed`) of `<image topic>` read it; its payload is
//! sent as recorded (the subscriber judges it, as it would a camera's). A video topic
//! (`foxglove_msgs/CompressedVideo`, `ffmpeg_image_transport_msgs/FFMPEGPacket`) goes out
//! the same way on `<image topic>/foxglove` or `/ffmpeg` (docs/VIDEO.md). With `--clock`
//! it also publishes `/clock` with the bag's time, for nodes with `use_sim_time`.

use super::ros_err;
use crate::bag::{Bag, PlayOptions, PlayStats};
use crate::config::Transport;
use crate::error::{Error, Result};
use crate::wire::msgs::{
    CameraInfo as BagCameraInfo, CompressedImage as BagCompressedImage, Image as BagImage,
    CAMERA_INFO_TYPE,
};
use r2r::builtin_interfaces::msg::Time;
use r2r::rosgraph_msgs::msg::Clock;
use r2r::QosProfile;
use std::time::{Duration, Instant};

/// `/clock` with the bag's time (`--clock`).
struct ClockOut {
    publisher: r2r::Publisher<Clock>,
    /// Between two ticks while waiting for the next message.
    period: Duration,
}

impl ClockOut {
    fn publish(&self, bag_ns: u64) -> Result<()> {
        let msg = Clock {
            clock: Time {
                sec: i32::try_from(bag_ns / 1_000_000_000).unwrap_or(i32::MAX),
                nanosec: (bag_ns % 1_000_000_000) as u32,
            },
        };
        self.publisher.publish(&msg).map_err(|e| ros_err("publishing /clock", e))
    }

    /// Sleep `wait` (until the message at bag time `due_ns`), ticking the bag's time on
    /// the way: at each tick, `due_ns` minus what is left of the wait at `rate`.
    fn wait(&self, wait: Duration, due_ns: u64, rate: f64) -> Result<()> {
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            let ahead = (left.as_secs_f64() * rate * 1e9) as u64;
            self.publish(due_ns.saturating_sub(ahead))?;
            std::thread::sleep(left.min(self.period));
        }
    }
}

impl ClockOut {
    /// The `/clock` publisher at `hz`, if asked for: rclcpp's ClockQoS (what rosbag2's
    /// player uses), reliable, volatile, depth 1.
    fn create(node: &mut r2r::Node, hz: Option<f64>) -> Result<Option<ClockOut>> {
        let Some(hz) = hz else {
            return Ok(None);
        };
        Ok(Some(ClockOut {
            publisher: node
                .create_publisher::<Clock>("/clock", QosProfile::default().keep_last(1))
                .map_err(|e| ros_err("creating the /clock publisher", e))?,
            period: Duration::try_from_secs_f64(1.0 / hz).unwrap_or(Duration::from_millis(25)),
        }))
    }
}

/// The topic a bag's image topic is published on: `image_topic` for `sensor_msgs/Image`,
/// `<image_topic>/<transport>` for the others (image_transport's name for that transport
/// of `image_topic`: `compressed`, `foxglove`, `ffmpeg`).
fn published_image_topic(image_topic: &str, transport: Transport) -> String {
    match transport {
        Transport::Raw => image_topic.to_string(),
        t => format!("{}/{}", image_topic.trim_end_matches('/'), t.name()),
    }
}

/// Wait (at most 20 s) until the image topic `topic` has `--wait-subscribers` subscribers.
fn wait_for_subscribers(
    node: &mut r2r::Node,
    (image_pub, topic): (&r2r::PublisherUntyped, &str),
    opts: &PlayOptions,
    stopped: &dyn Fn() -> bool,
) -> Result<()> {
    if opts.wait_subscribers == 0 {
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while image_pub.get_inter_process_subscription_count().unwrap_or(0) < opts.wait_subscribers
        && !stopped()
    {
        if Instant::now() > deadline {
            return Err(Error::Ros {
                context: format!("playing {}", opts.input.display()),
                message: format!(
                    "no subscriber on {topic} within 20 s (--wait-subscribers {})",
                    opts.wait_subscribers
                ),
            });
        }
        node.spin_once(Duration::from_millis(50));
    }
    // Let the new subscription's reader finish matching before the first sample.
    std::thread::sleep(Duration::from_millis(300));
    Ok(())
}

/// The player's node and its publishers of images (`out_topic`, messages of
/// `image_type`) and camera_info.
fn create_player(
    opts: &PlayOptions,
    out_topic: &str,
    image_type: &str,
) -> Result<(r2r::Node, (r2r::PublisherUntyped, r2r::PublisherUntyped))> {
    super::use_default_dds_profile();
    let ctx = r2r::Context::create().map_err(|e| ros_err("creating the ROS context", e))?;
    let mut node = r2r::Node::create(ctx, "vision_preproc_player", "")
        .map_err(|e| ros_err("creating the node", e))?;
    // Camera drivers publish best effort (sensor data QoS); so does the player, unless
    // asked to publish reliable (as `ros2 bag play` does for a reliable recording).
    let qos = if opts.reliable { QosProfile::default() } else { QosProfile::sensor_data() };
    let qos = qos.keep_last(5);
    let image_pub = node
        .create_publisher_untyped(out_topic, image_type, qos.clone())
        .map_err(|e| ros_err("creating the image publisher", e))?;
    let info_pub = node
        .create_publisher_untyped(&opts.camera_info_topic, CAMERA_INFO_TYPE, qos)
        .map_err(|e| ros_err("creating the camera_info publisher", e))?;
    Ok((node, (image_pub, info_pub)))
}

/// Publish bag message `m` (an image of `transport` when `is_image`, else a camera_info)
/// on its publisher of `(image, camera_info)`, restamped now with `restamp`, and count it;
/// one that does not decode is skipped and said. (A video packet's CDR is sent as
/// recorded: the node judges it, as it would a camera's.)
fn republish(
    m: crate::bag::RawMessage,
    (is_image, transport): (bool, Transport),
    (image_pub, info_pub): &(r2r::PublisherUntyped, r2r::PublisherUntyped),
    restamp: bool,
    stats: &mut PlayStats,
) -> Result<()> {
    let check = match (is_image, transport) {
        (true, Transport::Compressed) => BagCompressedImage::decode(&m.data).map(|_| ()),
        (true, Transport::Raw) => BagImage::decode(&m.data).map(|_| ()),
        (true, _) => Ok(()),
        (false, _) => BagCameraInfo::decode(&m.data).map(|_| ()),
    };
    if let Err(e) = check {
        stats.skipped.push(format!("{} at {}: {e}", m.topic, m.log_time));
        return Ok(());
    }
    let (publisher, count) =
        if is_image { (image_pub, &mut stats.images) } else { (info_pub, &mut stats.camera_infos) };
    let mut data = m.data;
    if restamp {
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        crate::bag::restamp(&mut data, u64::try_from(now.as_nanos()).unwrap_or(u64::MAX));
    }
    publisher.publish_raw(&data).map_err(|e| ros_err("publishing", e))?;
    *count += 1;
    Ok(())
}

/// Play the bag. Blocks until the end (or forever with `repeat`), or until SIGINT or
/// SIGTERM (then it stops after the message being published, as at the end).
pub fn play(opts: &PlayOptions) -> Result<PlayStats> {
    let stop = super::stop_on_signal()?;
    let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
    let bag = Bag::open(&opts.input)?;
    let image = bag.image_topic(opts.topic.as_deref())?;
    let transport = image.transport().unwrap_or(Transport::Raw);
    let image_topic = image.name;
    let out_topic = published_image_topic(&opts.image_topic, transport);
    let topics = bag.topics()?;
    let info_topic =
        topics.iter().find(|t| t.type_name == CAMERA_INFO_TYPE).map(|t| t.name.clone());

    let (mut node, publishers) = create_player(opts, &out_topic, &image.type_name)?;
    let image_pub = &publishers.0;
    let clock = ClockOut::create(&mut node, opts.clock_hz)?;
    wait_for_subscribers(&mut node, (image_pub, &out_topic), opts, &stopped)?;

    let mut stats = PlayStats { image_topic: out_topic.clone(), ..PlayStats::default() };
    let mut wanted = vec![image_topic.as_str()];
    if let Some(t) = &info_topic {
        wanted.push(t);
    }
    let started = Instant::now();
    let out_of_time =
        |now: Instant| stopped() || opts.duration.is_some_and(|d| now.duration_since(started) >= d);
    // The schedule runs on across passes of `repeat`: a pass starts one frame period
    // (the bag's mean image period) after the previous pass's last message, so a looped
    // bag of N frames recorded at 30 Hz plays at 30 Hz, not N frames per (N-1) periods.
    let mut clock_start: Option<Instant> = None;
    let mut pass_offset = Duration::ZERO;
    loop {
        let mut pass: Option<(u64, u64)> = None; // first and last log time of this pass
        let mut pass_images = 0u64;
        let damage = bag.for_each(&wanted, |m| {
            if out_of_time(Instant::now()) {
                return Ok(());
            }
            let (t0, _) = *pass.get_or_insert((m.log_time, m.log_time));
            pass = Some((t0, m.log_time.max(t0)));
            if m.topic == image_topic {
                pass_images += 1;
            }
            if !opts.max {
                let start = *clock_start.get_or_insert_with(Instant::now);
                let due = (pass_offset + Duration::from_nanos(m.log_time.saturating_sub(t0)))
                    .div_f64(opts.rate.max(1e-6));
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    match &clock {
                        Some(c) => c.wait(wait, m.log_time, opts.rate)?,
                        None => std::thread::sleep(wait),
                    }
                }
            }
            if let Some(c) = &clock {
                c.publish(m.log_time)?;
            }
            let kind = (m.topic == image_topic, transport);
            republish(m, kind, &publishers, opts.restamp, &mut stats)
        })?;
        stats.damage.extend(damage);
        if let Some((t0, t1)) = pass {
            let span = t1 - t0;
            // One image: no period in the bag; loop it at 30 Hz.
            let period = if pass_images > 1 { span / (pass_images - 1) } else { 33_333_333 };
            pass_offset += Duration::from_nanos(span + period);
        }
        node.spin_once(Duration::from_millis(1));
        if !opts.repeat || out_of_time(Instant::now()) {
            break;
        }
    }
    // Give best-effort samples still in the shared-memory queues time to be read.
    std::thread::sleep(Duration::from_millis(500));
    Ok(stats)
}
