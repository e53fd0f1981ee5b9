//! rosbag2 bags without ROS: read `sensor_msgs/Image` and `CameraInfo` from MCAP or
//! sqlite3 storage, write `Tensor` and `FrameTiming` to an MCAP bag. Used by the CLI's
//! `replay` (and `play`, which publishes what it reads).

pub mod cdr;
pub mod msgs;
pub mod read;
pub mod write;

pub use read::{Bag, RawMessage, TopicInfo};
pub use write::BagWriter;

/// The rosbag2 type name of images.
pub const IMAGE_TYPE: &str = "sensor_msgs/msg/Image";
/// The rosbag2 type name of camera infos.
pub const CAMERA_INFO_TYPE: &str = "sensor_msgs/msg/CameraInfo";

/// What to play and how.
#[derive(Debug, Clone)]
pub struct PlayOptions {
    /// The bag (folder, .mcap or .db3).
    pub input: std::path::PathBuf,
    /// Image topic of the bag to play (default: the only image topic).
    pub topic: Option<String>,
    /// Playback speed factor (1 = recorded timing).
    pub rate: f64,
    /// Publish as fast as possible, ignoring the recorded timing.
    pub max: bool,
    /// Start again at the end, until interrupted.
    pub repeat: bool,
    /// Topic the images are published on (relative names follow the namespace).
    pub image_topic: String,
    /// Topic the camera infos are published on.
    pub camera_info_topic: String,
    /// Wait (up to 20 s) for this many subscribers on the image topic before starting.
    pub wait_subscribers: usize,
}

/// What was played.
#[derive(Debug, Clone, Default)]
pub struct PlayStats {
    /// Images published.
    pub images: u64,
    /// Camera infos published.
    pub camera_infos: u64,
    /// Messages skipped, with reasons.
    pub skipped: Vec<String>,
    /// Damage found in the bag.
    pub damage: Vec<String>,
}
