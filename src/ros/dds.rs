//! The Fast DDS transports of the processes this crate starts: which Fast DDS the ROS
//! middleware loaded (2.x in Jazzy, 3.x from Kilted on: they read their XML profile from
//! differently named variables), the node's own profile, sized from its parsed
//! configuration before its DDS participant exists, and the shipped camera profile
//! (`config/fastdds_large_frames.xml`) that `play` and `record` use when the user gave
//! none.

use crate::config::Config;
use crate::transport::dds;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The variable Fast DDS 3 reads its XML profile from. Fast DDS 3 still reads the old
/// name too, with a deprecation warning (even when the new one is set beside it).
pub(super) const PROFILE_VAR_3: &str = "FASTDDS_DEFAULT_PROFILES_FILE";
/// The only variable Fast DDS 2 (ROS 2 Jazzy's 2.14) reads its XML profile from: the new
/// name is silently ignored there.
pub(super) const PROFILE_VAR_2: &str = "FASTRTPS_DEFAULT_PROFILES_FILE";

/// The Fast DDS library this process runs on, as the dynamic loader mapped it
/// (`libfastrtps.so.2.14.5`: Jazzy; `libfastdds.so.3.2.2`: Kilted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FastDds {
    /// Major version: decides the profile variable.
    pub major: u32,
    /// The full version, from the library's file name.
    pub version: String,
}

impl FastDds {
    /// The Fast DDS mapped into this process (`/proc/self/maps`, read once), if one is.
    /// The node and the CLI link the ROS middleware, so it is mapped from the start.
    pub(super) fn loaded() -> Option<&'static FastDds> {
        static LOADED: OnceLock<Option<FastDds>> = OnceLock::new();
        LOADED
            .get_or_init(|| Self::from_maps(&std::fs::read_to_string("/proc/self/maps").ok()?))
            .as_ref()
    }

    /// The Fast DDS named in a `/proc/<pid>/maps` text.
    pub(super) fn from_maps(maps: &str) -> Option<FastDds> {
        maps.lines().filter_map(|l| l.rsplit('/').next()).find_map(|file| {
            let version = ["libfastdds.so.", "libfastrtps.so."]
                .iter()
                .find_map(|stem| file.strip_prefix(stem))?
                .trim();
            let major = version.split('.').next()?.parse().ok()?;
            Some(FastDds { major, version: version.to_string() })
        })
    }

    /// The variable this Fast DDS reads its XML profile from.
    pub(super) fn profile_var(&self) -> &'static str {
        if self.major >= 3 {
            PROFILE_VAR_3
        } else {
            PROFILE_VAR_2
        }
    }

    /// The other name, which this Fast DDS ignores (2.x) or reads with a deprecation
    /// warning (3.x).
    pub(super) fn other_profile_var(&self) -> &'static str {
        if self.major >= 3 {
            PROFILE_VAR_2
        } else {
            PROFILE_VAR_3
        }
    }
}

/// The profile variable of the Fast DDS this process runs on; Fast DDS 3's name when no
/// Fast DDS is mapped (never the case in a binary built with ROS).
pub(super) fn profile_var() -> &'static str {
    names().0
}

/// (the name the loaded Fast DDS reads its profile from, the other name, whether it reads
/// the other name too): Fast DDS 3's when none is mapped.
fn names() -> (&'static str, &'static str, bool) {
    FastDds::loaded().map_or((PROFILE_VAR_3, PROFILE_VAR_2, true), |f| {
        (f.profile_var(), f.other_profile_var(), f.major >= 3)
    })
}

/// A variable's value, an empty one counting as unset.
fn set(var: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(var).filter(|v| !v.is_empty())
}

/// A profile given only under the name the loaded Fast DDS ignores (Fast DDS 2 and
/// `FASTDDS_DEFAULT_PROFILES_FILE`), set under the name it reads: this process uses it all
/// the same. Returns that name and value when it did (a process started the same way, the
/// camera's, ignores it: worth a warning).
fn adopt_ignored_name() -> Option<(&'static str, std::ffi::OsString)> {
    let (var, other, reads_other) = names();
    if reads_other || set(var).is_some() {
        return None;
    }
    let v = set(other)?;
    std::env::set_var(var, &v);
    Some((other, v))
}

/// One line for `info` and `/diagnostics`: the Fast DDS loaded and the profile in force.
pub(super) fn describe() -> (String, String) {
    let (var, other, reads_other) = names();
    let fastdds = match FastDds::loaded() {
        Some(f) => format!("{} (reads {var})", f.version),
        None => "not loaded".into(),
    };
    let profile = match (set(var), set(other)) {
        (Some(v), _) => format!("{var}={}", v.to_string_lossy()),
        (None, Some(v)) if reads_other => {
            format!(
                "{other}={} (the old name: read, with a deprecation warning)",
                v.to_string_lossy()
            )
        }
        (None, Some(v)) => format!(
            "none: {other}={} is set, but this Fast DDS reads only {var}",
            v.to_string_lossy()
        ),
        (None, None) => format!("none ({var} unset): Fast DDS's built-in transports"),
    };
    (fastdds, profile)
}

/// The Fast DDS transports of the node: the user's, or its own with its shared-memory
/// segment sized from its largest output.
pub(super) enum DdsSetup {
    /// A profile (under the name the loaded Fast DDS reads) or `FASTDDS_BUILTIN_TRANSPORTS`
    /// was given.
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
    ///
    /// A profile given under the name this Fast DDS does not read (Jazzy's Fast DDS 2 and
    /// `FASTDDS_DEFAULT_PROFILES_FILE`) is used all the same, under the right name, and
    /// said in the returned warning: the camera's process, started the same way, ignores it.
    pub(super) fn configure(config: &Config) -> crate::Result<(DdsSetup, Option<String>)> {
        let var = profile_var();
        let warning = adopt_ignored_name().map(|(other, v)| {
            format!(
                "{other} is set, but this Fast DDS ({}) reads only {var}: the node uses \
                 the profile under that name; other processes started the same way (the \
                 camera driver) ignore it. Set {var}={} instead",
                FastDds::loaded().map_or("?", |f| f.version.as_str()),
                v.to_string_lossy()
            )
        });
        // The name it reads (set now if the profile came under the other one), the other
        // name where Fast DDS 3 still reads it, the built-in transports' choice.
        for name in [var, names().1, "FASTDDS_BUILTIN_TRANSPORTS"] {
            if let Some(v) = set(name) {
                return Ok((DdsSetup::User(format!("{name}={}", v.to_string_lossy())), warning));
            }
        }
        let largest = dds::largest_output(config);
        let segment = dds::segment_size(largest);
        let udp = dds::socket_buffer_limit().map_or(dds::UDP_BUFFER, |l| l.min(dds::UDP_BUFFER));
        let file =
            std::env::temp_dir().join(format!("vision_preproc_fastdds_{}.xml", std::process::id()));
        std::fs::write(&file, dds::profile_xml(segment, udp)).map_err(|e| {
            crate::Error::io(
                format!(
                    "writing the node's Fast DDS profile {} (set {var} to a profile of your \
                     own, e.g. config/fastdds_large_frames.xml, instead)",
                    file.display()
                ),
                e,
            )
        })?;
        std::env::set_var(var, &file);
        Ok((DdsSetup::Sized { file, segment, largest }, None))
    }
}

impl Drop for DdsSetup {
    fn drop(&mut self) {
        if let DdsSetup::Sized { file, .. } = self {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// For `play` and `record`: unless a profile is set under the name the loaded Fast DDS
/// reads, set that name to the given one's value (a profile under the other name, which
/// Fast DDS 2 would ignore) or else to the profile for camera-sized samples shipped with
/// the package.
pub(super) fn use_default_dds_profile() {
    if FastDds::loaded().is_none() {
        return;
    }
    adopt_ignored_name();
    let (var, other, reads_other) = names();
    if set(var).is_some() || (reads_other && set(other).is_some()) {
        return;
    }
    if let Some(p) = shipped_dds_profile() {
        std::env::set_var(var, p);
    }
}

/// The shipped camera profile `fastdds_large_frames.xml`, whatever the environment says:
/// next to the executable in a colcon install (`lib/vision_preproc/` ->
/// `share/vision_preproc/config/`), else in the source tree the binary was built from.
pub(super) fn shipped_dds_profile() -> Option<PathBuf> {
    let name = "fastdds_large_frames.xml";
    let installed = std::env::current_exe().ok().and_then(|exe| {
        Some(exe.parent()?.parent()?.parent()?.join("share/vision_preproc/config").join(name))
    });
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("config").join(name);
    installed.into_iter().chain([source]).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_dds_of_each_distribution_and_its_profile_variable() {
        // Lines of /proc/<pid>/maps of the node on each distribution's wheels.
        let jazzy = "7f1c2a000000-7f1c2a3c0000 r-xp 00000000 fe:01 123 \
                     /w/.ros-jazzy/venv/lib/libfastrtps.so.2.14.5\n";
        let kilted = "7f00-7f10 r--p 00000000 fe:01 9 /w/.ros-kilted/venv/lib/libfastcdr.so.2.3.0\n\
                      7f10-7f20 r-xp 00000000 fe:01 7 /w/.ros-kilted/venv/lib/libfastdds.so.3.2.2\n";
        let j = FastDds::from_maps(jazzy).expect("jazzy");
        assert_eq!((j.major, j.version.as_str()), (2, "2.14.5"));
        assert_eq!((j.profile_var(), j.other_profile_var()), (PROFILE_VAR_2, PROFILE_VAR_3));
        let k = FastDds::from_maps(kilted).expect("kilted");
        assert_eq!((k.major, k.version.as_str()), (3, "3.2.2"));
        assert_eq!(k.profile_var(), "FASTDDS_DEFAULT_PROFILES_FILE");
        assert_eq!(FastDds::from_maps("7f-8f r-xp 0 0 0 /usr/lib/libc.so.6\n"), None);
    }
}
