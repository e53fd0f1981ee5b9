//! The Fast DDS transports of the processes this crate starts: the node's own profile,
//! sized from its parsed configuration before its DDS participant exists, and the
//! shipped camera profile (`config/fastdds_large_frames.xml`) that `play` and `record`
//! use when the user gave none.

use crate::config::Config;
use crate::transport::dds;
use std::path::{Path, PathBuf};

/// The Fast DDS transports of the node: the user's, or its own with its shared-memory
/// segment sized from its largest output.
pub enum DdsSetup {
    /// `FASTDDS_DEFAULT_PROFILES_FILE` (or `FASTDDS_BUILTIN_TRANSPORTS`) was given.
    User(String),
    /// The node wrote its own profile to this file, for outputs up to `largest` bytes.
    Sized {
        /// The profile written (removed when this value is dropped).
        file: PathBuf,
        /// Bytes of the shared-memory segment.
        segment: usize,
        /// The largest output the segment holds [`dds::SEGMENT_SAMPLES`] of.
        largest: usize,
    },
}

impl DdsSetup {
    /// For the node whose configuration is `config` (the one it starts with: parsed from
    /// the command line before the DDS participant exists, while this process has one
    /// thread).
    pub fn configure(config: &Config) -> anyhow::Result<DdsSetup> {
        // (An empty value counts as unset.)
        for var in [
            "FASTDDS_DEFAULT_PROFILES_FILE",
            "FASTRTPS_DEFAULT_PROFILES_FILE",
            "FASTDDS_BUILTIN_TRANSPORTS",
        ] {
            if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                return Ok(DdsSetup::User(format!("{var}={}", v.to_string_lossy())));
            }
        }
        let largest = dds::largest_output(config);
        let segment = dds::segment_size(largest);
        let udp = dds::socket_buffer_limit().map_or(dds::UDP_BUFFER, |l| l.min(dds::UDP_BUFFER));
        let file =
            std::env::temp_dir().join(format!("vision_preproc_fastdds_{}.xml", std::process::id()));
        std::fs::write(&file, dds::profile_xml(segment, udp)).map_err(|e| {
            anyhow::anyhow!(
                "writing the node's Fast DDS profile {}: {e}; set FASTDDS_DEFAULT_PROFILES_FILE \
                 to a profile of your own (e.g. config/fastdds_large_frames.xml) instead",
                file.display()
            )
        })?;
        std::env::set_var("FASTDDS_DEFAULT_PROFILES_FILE", &file);
        Ok(DdsSetup::Sized { file, segment, largest })
    }
}

impl Drop for DdsSetup {
    fn drop(&mut self) {
        if let DdsSetup::Sized { file, .. } = self {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// The Fast DDS profile for camera-sized samples shipped with the package, if
/// `FASTDDS_DEFAULT_PROFILES_FILE` is not already set (for `play` and `record`).
pub fn default_dds_profile() -> Option<PathBuf> {
    if std::env::var_os("FASTDDS_DEFAULT_PROFILES_FILE").is_some() {
        return None;
    }
    shipped_dds_profile()
}

/// The shipped camera profile `fastdds_large_frames.xml`, whatever the environment says:
/// next to the executable in a colcon install (`lib/vision_preproc/` ->
/// `share/vision_preproc/config/`), else in the source tree the binary was built from.
pub fn shipped_dds_profile() -> Option<PathBuf> {
    let name = "fastdds_large_frames.xml";
    let installed = std::env::current_exe().ok().and_then(|exe| {
        Some(exe.parent()?.parent()?.parent()?.join("share/vision_preproc/config").join(name))
    });
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("config").join(name);
    installed.into_iter().chain([source]).find(|p| p.is_file())
}
