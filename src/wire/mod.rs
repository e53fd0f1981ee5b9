//! The wire format of the live path and of bags, without ROS: CDR (XCDR1, as rmw and
//! rosbag2 serialize messages) and the messages the node and the CLI read and write, with
//! their ROS type names written once. The pipeline lays its output messages out with it,
//! `bag/` reads and writes bags with it, `ros/` publishes its bytes as they are.

pub(crate) mod cdr;
pub mod msgs;
