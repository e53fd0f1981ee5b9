//! `vision_preproc play IN`: publish a bag's images on `image` (a compressed topic's on
//! `image/compressed`) and camera_info on `camera_info`, with the recorded timing.

use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use vision_preproc::ros::{play, PlayOptions};

/// Arguments of `play`.
#[derive(Args, Debug)]
pub struct PlayArgs {
    /// Input bag: a rosbag2 folder, a .mcap or a .db3 file.
    pub input: PathBuf,
    /// Image topic of the bag (default: its only image topic, sensor_msgs/msg/Image or
    /// sensor_msgs/msg/CompressedImage).
    #[arg(long)]
    pub topic: Option<String>,
    /// Speed factor of the recorded timing.
    #[arg(long, default_value_t = 1.0, conflicts_with = "max")]
    pub rate: f64,
    /// Publish as fast as possible.
    #[arg(long)]
    pub max: bool,
    /// Start again at the end (until Ctrl-C).
    #[arg(long = "loop")]
    pub repeat: bool,
    /// Topic to publish the images on. A CompressedImage topic goes out on
    /// `<IMAGE_TOPIC>/compressed`, image_transport's name for it (a node with
    /// `image_transport: compressed` reading IMAGE_TOPIC subscribes there).
    #[arg(long, default_value = "image")]
    pub image_topic: String,
    /// Topic to publish the camera infos on.
    #[arg(long, default_value = "camera_info")]
    pub camera_info_topic: String,
    /// Wait (up to 20 s) for this many subscribers on the image topic before starting.
    #[arg(long, default_value_t = 0)]
    pub wait_subscribers: usize,
    /// Stamp each message with the time it is published instead of the recorded stamp
    /// (for end-to-end latency measurements).
    #[arg(long)]
    pub restamp: bool,
    /// Stop after this many seconds (e.g. with --loop).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Publish reliable (what `ros2 bag play` does for a topic recorded from a reliable
    /// publisher) instead of best effort (a camera driver's sensor-data QoS).
    #[arg(long)]
    pub reliable: bool,
    /// Publish /clock with the bag's time (its log times) for nodes with use_sim_time, as
    /// `ros2 bag play --clock` does: HZ times a second between messages (default 40) and
    /// at each message. The time goes back at each --loop pass.
    #[arg(long, value_name = "HZ", num_args = 0..=1, default_missing_value = "40", conflicts_with = "restamp")]
    pub clock: Option<f64>,
}

pub fn run(a: PlayArgs) -> Result<()> {
    if !(a.rate > 0.0 && a.rate.is_finite()) {
        bail!("--rate {}: use a positive factor (1 = recorded timing)", a.rate);
    }
    if let Some(hz) = a.clock {
        if !(hz > 0.0 && hz.is_finite()) {
            bail!("--clock {hz}: use a positive rate in Hz (default 40)");
        }
    }
    let stats = play(&PlayOptions {
        input: a.input,
        topic: a.topic,
        rate: a.rate,
        max: a.max,
        repeat: a.repeat,
        image_topic: a.image_topic,
        camera_info_topic: a.camera_info_topic,
        wait_subscribers: a.wait_subscribers,
        restamp: a.restamp,
        reliable: a.reliable,
        clock_hz: a.clock,
        duration: match a.duration {
            Some(s) if s.is_finite() && s > 0.0 => Some(std::time::Duration::from_secs_f64(s)),
            Some(s) => bail!("--duration {s}: use a positive number of seconds"),
            None => None,
        },
    })?;
    println!(
        "play: {} images, {} camera infos published, {} skipped",
        stats.images,
        stats.camera_infos,
        stats.skipped.len()
    );
    println!("  images on {}", stats.image_topic);
    for s in stats.skipped.iter().chain(&stats.damage) {
        println!("  {s}");
    }
    Ok(())
}
