//! Everything that speaks ROS 2 through r2r (feature "ros"): the node ([`node`]), the
//! `play` and `record` tools of the CLI, the conversion between r2r's messages and the
//! crate's own types (`native`), and the Fast DDS set-up (`dds`). Nothing outside this folder names r2r (the
//! node and CLI binaries call in here); `test/python/test_layering.py` checks it.

mod dds;
mod native;
pub mod node;
mod participant;
mod play;
mod record;

use dds::use_default_dds_profile;

/// A failed r2r call while `what` was being done, as the crate's error.
fn ros_err(what: &str, e: r2r::Error) -> crate::error::Error {
    crate::error::Error::Ros { context: what.to_string(), message: e.to_string() }
}

/// The Fast DDS this process loaded and the XML profile in force (for `info`).
pub fn fastdds_status() -> (String, String) {
    dds::describe()
}

pub use crate::bag::{PlayOptions, PlayStats, RecordOptions, RecordStats};
pub use play::play;
pub use record::record;

/// SIGINT (Ctrl-C) and SIGTERM, listened to from the moment this value exists (made
/// early, a signal that arrives while the process is still starting is not lost, and
/// does not kill the process half-way: it ends it as a later one would).
struct ShutdownSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    /// Start listening. Needs a tokio runtime context (`Runtime::enter`).
    fn listen() -> std::io::Result<ShutdownSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(ShutdownSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Resolves on the first SIGINT or SIGTERM since [`ShutdownSignals::listen`].
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// A flag set on SIGINT (Ctrl-C) or SIGTERM, for the CLI's blocking loops (`play`,
/// `record`), which then end as they would at their end: summary printed, exit 0 (as
/// `ros2 bag play` does when a launch file is stopped).
fn stop_on_signal() -> crate::error::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let io = |e| crate::error::Error::io("starting the signal watcher", e);
    let watcher = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io)?;
    let mut signals = {
        let _context = watcher.enter();
        ShutdownSignals::listen().map_err(io)?
    };
    let flag = std::sync::Arc::clone(&stop);
    std::thread::spawn(move || {
        watcher.block_on(signals.recv());
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    Ok(stop)
}
