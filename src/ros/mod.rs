//! Everything that speaks ROS 2 through r2r (feature "ros"): the node ([`node`]), the
//! `play` and `record` tools of the CLI, and the conversion between r2r's messages and
//! the crate's own types (`native`). Nothing outside this folder names r2r (the
//! node and CLI binaries call in here); `test/python/test_layering.py` checks it.

mod native;
pub mod node;
mod play;
mod record;

use node::{default_dds_profile, shutdown_signal};

pub use crate::bag::{PlayOptions, PlayStats, RecordOptions, RecordStats};
pub use play::play;
pub use record::record;
