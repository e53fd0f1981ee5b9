//! Everything that speaks ROS 2 through r2r (feature "ros"): the node ([`node`]), the
//! `play` and `record` tools of the CLI, the conversion between r2r's messages and the
//! crate's own types (`native`), and the Fast DDS set-up (`dds`). Nothing outside this folder names r2r (the
//! node and CLI binaries call in here); `test/python/test_layering.py` checks it.

mod dds;
mod native;
pub mod node;
mod play;
mod record;

use dds::default_dds_profile;

pub use crate::bag::{PlayOptions, PlayStats, RecordOptions, RecordStats};
pub use play::play;
pub use record::record;

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
