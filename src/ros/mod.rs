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

/// A flag set on SIGINT (Ctrl-C) or SIGTERM, for the CLI's blocking loops (`play`,
/// `record`), which then end as they would at their end: summary printed, exit 0 (as
/// `ros2 bag play` does when a launch file is stopped).
fn stop_on_signal() -> crate::error::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::error::Error::io("starting the signal watcher", e))?;
    let flag = std::sync::Arc::clone(&stop);
    std::thread::spawn(move || {
        watcher.block_on(shutdown_signal());
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    Ok(stop)
}

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
