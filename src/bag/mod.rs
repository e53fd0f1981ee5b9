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
