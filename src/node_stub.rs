//! Stand-in for the ROS node when the `ros` feature is off (e.g. the GPU test machine,
//! which has no ROS): the binary exists, says why it cannot run, and exits with 2.
//! (cargo-ament-build installs only binaries without `required-features`, so the node
//! binary is always built.)

use std::process::ExitCode;

/// Entry point of `vision_preproc_node` without ROS.
pub fn main() -> ExitCode {
    eprintln!(
        "vision_preproc_node was built without the `ros` feature; rebuild with default \
         features (cargo build --release) in an environment with ROS 2 sourced"
    );
    ExitCode::from(2)
}

/// `play` options (see the `ros` build); accepted so the CLI builds without ROS.
#[derive(Debug, Clone)]
pub struct PlayOptions {
    /// The bag.
    pub input: std::path::PathBuf,
    /// Image topic of the bag.
    pub topic: Option<String>,
    /// Playback speed factor.
    pub rate: f64,
    /// As fast as possible.
    pub max: bool,
    /// Start again at the end.
    pub repeat: bool,
    /// Output image topic.
    pub image_topic: String,
    /// Output camera_info topic.
    pub camera_info_topic: String,
    /// Subscribers to wait for.
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

/// Always an error: publishing needs ROS.
pub fn play(_opts: &PlayOptions) -> crate::Result<PlayStats> {
    Err(crate::Error::Bag {
        path: "play".into(),
        message: "this binary was built without the `ros` feature; `play` needs ROS 2".into(),
    })
}
