//! `vision_preproc_lifecycle_node`: the ROS 2 node as a managed (lifecycle) node. All the
//! work is in `vision_preproc::ros::node` (`managed.rs`).

// The house rules that a lint can keep (docs/ARCHITECTURE.md): no unwrap/expect outside
// tests, a `// SAFETY:` comment on every unsafe block.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(clippy::undocumented_unsafe_blocks)]

fn main() -> std::process::ExitCode {
    vision_preproc::ros::node::managed_main()
}
