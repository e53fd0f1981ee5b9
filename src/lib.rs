//! vision_preproc turns camera frames into network-ready tensors: decode any common
//! camera encoding, crop, resize (bilinear or nearest) with letterbox or centre crop,
//! normalize, reorder channels and lay the result out as NCHW/NHWC float32/float16, then
//! optionally convolve — in one pass.
//!
//! Three layers, arrows pointing down only:
//!
//! ```text
//! ros/       r2r + tokio: the node (topics, QoS, parameters, diagnostics), play, record,
//!            message <-> view conversion  (feature "ros"); nothing else names r2r
//!   | uses
//! pipeline/  validated config, geometry, operations per frame size, backend selection
//!   | uses
//! backend/   trait Backend  ->  cpu/ (the specification)  |  cuda/ (feature "cuda")
//! ```
//!
//! [`config`] and [`image`] are the shared vocabulary (the parameters; a validated view
//! of an input image). [`transport`] holds the message path's decisions without ROS
//! types (keep-latest slot, batch synchronizer, input QoS rule, delivery monitor, Fast
//! DDS segment size), [`wire`] the CDR of the messages and their type names, [`bag`]
//! rosbag2 files, [`capture`] (feature `gstreamer`; without it a stub that refuses
//! `gst:` inputs) frames from a GStreamer pipeline as image views (no ROS: the node's
//! inputs sit above it, beside `transport`), [`compressed`] JPEG/PNG payloads of
//! `sensor_msgs/CompressedImage` decoded on the CPU into image views (no ROS; the node
//! subscribes to them with `image_transport: compressed` or `input_transports`), [`video`]
//! video packets read before a decoder sees them (codec, key frames, sizes; no ROS, no
//! GStreamer: `capture` decodes them for the node's video inputs), [`nvtx`]
//! the profiler ranges of each frame and stage (loaded only when a tool asks). [`handoff`] is the zero-copy hand-off's pool (the node's side, used by
//! the pipeline and the backends' device blocks); [`consumer`], a consumer process's side
//! in Rust, sits above it and the backends (it imports the CUDA blocks), never below:
//! `handoff/` never imports `backend/`. [`boxes`] maps detections between network and
//! source pixels with a message's published geometry (re-exported by [`consumer`]). `backend/` never imports r2r and `ros/` never
//! imports cudarc.

// The house rules that a lint can keep (docs/ARCHITECTURE.md): no unwrap/expect outside
// tests, a `// SAFETY:` comment on every unsafe block.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(clippy::undocumented_unsafe_blocks)]
// Every `pub` item is reachable from the crate's root: the API the binaries, tests, fuzz
// targets and examples use; the rest is pub(crate) or private.
#![warn(unreachable_pub)]
// Without ROS, the parts only the node uses (delivery monitor, DDS sizing, the hand-off's
// server, run-time reconfiguration) are compiled but not called: dead code is found by
// the builds with ROS.
#![cfg_attr(not(feature = "ros"), allow(dead_code, unused_imports))]

pub mod backend;
pub mod bag;
pub mod boxes;
#[cfg(feature = "gstreamer")]
pub mod capture;
#[cfg(not(feature = "gstreamer"))]
#[path = "capture_stub.rs"]
pub mod capture;
pub mod compressed;
pub mod config;
pub mod consumer;
pub mod error;
pub mod handoff;
pub mod image;
pub mod nvtx;
pub mod percentile;
pub mod pipeline;
pub mod rng;
#[cfg(feature = "ros")]
pub mod ros;
#[cfg(not(feature = "ros"))]
#[path = "ros_stub.rs"]
pub mod ros;
pub mod transport;
pub mod video;
pub mod wire;

pub use config::Config;
pub use error::{CaptureError, DecodeError, Error, ImageError, Result};
pub use image::{DeviceContext, DeviceMemory, DeviceView, Encoding, ImageView};
pub use pipeline::{Geometry, Pipeline};
