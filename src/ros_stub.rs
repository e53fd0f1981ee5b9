//! Stand-in for the ROS module (node, play, record) when the `ros` feature is off (e.g. the GPU test machine,
//! which has no ROS): the binary exists, says why it cannot run, and exits with 2.
//! (cargo-ament-build installs only binaries without `required-features`, so the node
//! binary is always built.)

/// The node without ROS.
pub mod node {
    use std::process::ExitCode;

    /// Entry point of `vision_preproc_node` without ROS.
    pub fn main() -> ExitCode {
        eprintln!(
            "vision_preproc_node was built without the `ros` feature; rebuild with default \
             features (cargo build --release) in an environment with ROS 2 sourced"
        );
        ExitCode::from(2)
    }

    /// Entry point of `vision_preproc_lifecycle_node` without ROS.
    pub fn managed_main() -> ExitCode {
        eprintln!(
            "vision_preproc_lifecycle_node was built without the `ros` feature; rebuild with \
             default features (cargo build --release) in an environment with ROS 2 sourced"
        );
        ExitCode::from(2)
    }
}

pub use crate::bag::{PlayOptions, PlayStats, RecordOptions, RecordStats};

/// No Fast DDS without ROS (for `info`).
pub fn fastdds_status() -> (String, String) {
    ("none: built without the `ros` feature".into(), "none".into())
}

/// Always an error: publishing needs ROS.
pub fn play(_opts: &PlayOptions) -> crate::Result<PlayStats> {
    Err(crate::Error::Ros {
        context: "play".into(),
        message: "this binary was built without the `ros` feature; `play` needs ROS 2: rebuild \
                  with default features in an environment with ROS 2 sourced"
            .into(),
    })
}

/// Always an error: subscribing needs ROS.
pub fn record(_opts: &RecordOptions) -> crate::Result<RecordStats> {
    Err(crate::Error::Ros {
        context: "record".into(),
        message: "this binary was built without the `ros` feature; `record` needs ROS 2: \
                  rebuild with default features in an environment with ROS 2 sourced"
            .into(),
    })
}
