//! rosbag2 bags without ROS: read `sensor_msgs/Image`, `CompressedImage` and
//! `CameraInfo` from MCAP or sqlite3 storage, write `Tensor` and `FrameTiming` to an MCAP bag. Used by the CLI's
//! `replay` (and `play`, which publishes what it reads).

pub(crate) mod read;
pub(crate) mod write;

pub use read::{Bag, RawMessage, TopicInfo};
pub use write::BagWriter;

/// What to play and how.
#[derive(Debug, Clone)]
pub struct PlayOptions {
    /// The bag (folder, .mcap or .db3).
    pub input: std::path::PathBuf,
    /// Image topic of the bag to play (default: the only image topic, `sensor_msgs/Image`
    /// or `sensor_msgs/CompressedImage`).
    pub topic: Option<String>,
    /// Playback speed factor (1 = recorded timing).
    pub rate: f64,
    /// Publish as fast as possible, ignoring the recorded timing.
    pub max: bool,
    /// Start again at the end, until interrupted.
    pub repeat: bool,
    /// Topic the images are published on (relative names follow the namespace); a
    /// compressed topic's on `<image_topic>/compressed`, as image_transport names it.
    pub image_topic: String,
    /// Topic the camera infos are published on.
    pub camera_info_topic: String,
    /// Wait (up to 20 s) for this many subscribers on the image topic before starting.
    pub wait_subscribers: usize,
    /// Replace each message's header stamp with the wall-clock time of publishing (to
    /// measure end-to-end latency); otherwise the recorded stamps are sent.
    pub restamp: bool,
    /// Stop after this long (with `repeat`, the only way to end besides a signal).
    pub duration: Option<std::time::Duration>,
    /// Publish reliable instead of best effort.
    pub reliable: bool,
    /// Publish `/clock` with the bag's time (its log times), this many times a second
    /// while waiting for the next message and at each message, as `ros2 bag play
    /// --clock` does: nodes with `use_sim_time` then run on the bag's time.
    pub clock_hz: Option<f64>,
}

/// What was played.
#[derive(Debug, Clone, Default)]
pub struct PlayStats {
    /// The topic the images went out on (`<image_topic>/compressed` for a compressed
    /// topic).
    pub image_topic: String,
    /// Images published.
    pub images: u64,
    /// Camera infos published.
    pub camera_infos: u64,
    /// Messages skipped, with reasons.
    pub skipped: Vec<String>,
    /// Damage found in the bag.
    pub damage: Vec<String>,
}

/// Overwrite the `header.stamp` of a CDR message whose first field is a
/// `std_msgs/Header` (Image, CompressedImage, CameraInfo) with `ns` since the epoch. Returns false (and
/// changes nothing) when the message is too short or not CDR.
pub fn restamp(cdr: &mut [u8], ns: u64) -> bool {
    if cdr.len() < 12 || cdr[0] != 0 || cdr[1] > 1 {
        return false;
    }
    let sec = i32::try_from(ns / 1_000_000_000).unwrap_or(i32::MAX);
    let nanosec = (ns % 1_000_000_000) as u32;
    let (s, n) = if cdr[1] == 1 {
        (sec.to_le_bytes(), nanosec.to_le_bytes())
    } else {
        (sec.to_be_bytes(), nanosec.to_be_bytes())
    };
    cdr[4..8].copy_from_slice(&s);
    cdr[8..12].copy_from_slice(&n);
    true
}

#[cfg(test)]
mod tests {
    use crate::wire::msgs::{Header, Image};

    #[test]
    fn restamp_rewrites_only_the_stamp() {
        let data = [7u8; 6];
        let img = Image::packed(
            Header { sec: 1, nanosec: 2, frame_id: "cam".into() },
            "rgb8",
            2,
            1,
            &data,
        );
        let mut cdr = img.encode();
        assert!(super::restamp(&mut cdr, 1_700_000_000_123_456_789));
        let back = Image::decode(&cdr).unwrap();
        assert_eq!((back.header.sec, back.header.nanosec), (1_700_000_000, 123_456_789));
        assert_eq!(
            Image { header: Header { sec: 1, nanosec: 2, ..back.header.clone() }, ..back },
            img
        );
        assert!(!super::restamp(&mut [0u8, 1, 0], 5));
    }
}

/// What to record and for how long (`vision_preproc record`).
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// The bag folder to create (it must not exist); `None`: write nothing, only count
    /// and time what arrives (`record --count-only`, for rate sweeps where writing
    /// gigabytes a second would be the bottleneck).
    pub output: Option<std::path::PathBuf>,
    /// The tensor topic (`vision_preproc_msgs/msg/Tensor`, or `TensorBatch` with `batch`).
    pub tensor_topic: String,
    /// The node has 2+ `inputs`: record `TensorBatch` (end-to-end latency per valid, not
    /// repeated item, from its own stamp).
    pub batch: bool,
    /// The timing topic (`vision_preproc_msgs/msg/FrameTiming`).
    pub timing_topic: String,
    /// Stop after this many tensors.
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<std::time::Duration>,
    /// Also print each `/diagnostics` status whose level or message changed.
    pub print_diagnostics: bool,
}

/// What `record` wrote.
#[derive(Debug, Clone, Default)]
pub struct RecordStats {
    /// Tensors received (and written, with an output).
    pub tensors: u64,
    /// Timings received (and written, with an output).
    pub timings: u64,
    /// The MCAP file (`None` with `--count-only`).
    pub output: Option<std::path::PathBuf>,
    /// Per tensor: receive time minus header stamp, ms (the end-to-end latency when the
    /// publisher stamped frames with the publish time, `play --restamp`).
    pub e2e_ms: Vec<f64>,
    /// Per timing: `total_us` in ms (node-added latency: frame received -> published).
    pub node_ms: Vec<f64>,
    /// Per timing: the stages `decode_us`, `upload_us`, `preprocess_us`, `conv_us`,
    /// `download_us`.
    pub stages_us: Vec<[f32; 5]>,
    /// Receive times (ns since the epoch) of the first and last tensor.
    pub first_last_ns: Option<(u64, u64)>,
}
