//! Embeds the ROS 2 library directories in the binaries as DT_RPATH, so that
//! `vision_preproc_node` starts with a clean environment (no sourced setup file, no
//! LD_LIBRARY_PATH). DT_RPATH rather than DT_RUNPATH: RPATH also applies to the
//! dependencies of the libraries we load (librcl -> libfastdds -> vendored libs), which
//! the PyPI wheels cannot find on their own.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=AMENT_PREFIX_PATH");
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_ROS").is_none() {
        return;
    }
    // The /rosout handler's formatting of C varargs (see the file's comment).
    println!("cargo:rerun-if-changed=src/ros/node/vformat.c");
    cc::Build::new()
        .file("src/ros/node/vformat.c")
        .warnings(true)
        .compile("vision_preproc_vformat");
    let prefixes = env::var("AMENT_PREFIX_PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for prefix in prefixes.split(':').filter(|p| !p.is_empty()) {
        let lib = Path::new(prefix).join("lib");
        if lib.is_dir() {
            dirs.push(lib.clone());
        }
        // PyPI wheels vendor their third-party libraries in site-packages/ros_*.libs.
        dirs.extend(vendored_lib_dirs(&lib));
    }
    for dir in dirs {
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{}", dir.display());
    }
}

fn vendored_lib_dirs(lib: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(lib) else {
        return out;
    };
    for python in entries.flatten() {
        let name = python.file_name();
        if !name.to_string_lossy().starts_with("python3") {
            continue;
        }
        let site = python.path().join("site-packages");
        let Ok(pkgs) = std::fs::read_dir(&site) else {
            continue;
        };
        let mut found: Vec<PathBuf> = pkgs
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .map(|n| {
                            let n = n.to_string_lossy();
                            n.starts_with("ros_") && n.ends_with(".libs")
                        })
                        .unwrap_or(false)
            })
            .collect();
        found.sort();
        out.extend(found);
    }
    out
}
