//! `vision_preproc_node`: the ROS 2 node. All the work is in `vision_preproc::ros::node`.

fn main() -> std::process::ExitCode {
    vision_preproc::ros::node::main()
}
