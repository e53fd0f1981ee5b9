"""Launch vision_preproc_node.

    ros2 launch vision_preproc preprocess.launch.py \
        namespace:=front_camera image:=/front_camera/image_raw \
        config:=$(ros2 pkg prefix vision_preproc)/share/vision_preproc/config/yolo_640_letterbox.yaml

Parameters come from the `config` file. The parameter arguments (`backend`,
`use_sim_time`) are passed to the node only when given: left empty, the file's value (or
the node's default) holds. `respawn:=true` restarts the node when it exits (with
`gpu_failure_policy: exit`, a GPU failure then ends in a fresh process). `ros2 launch
vision_preproc preprocess.launch.py --show-args` lists the arguments.

preprocess.launch.xml declares the same arguments and includes this file (tests check
that both declare the same arguments, and what this file starts).
"""

import yaml
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

SHARE = FindPackageShare("vision_preproc")

# name, default, description (preprocess.launch.xml has the same, a test compares them).
ARGUMENTS = [
    ("namespace", "", "Namespace of the node and its topics"),
    ("config", PathJoinSubstitution([SHARE, "config", "default.yaml"]),
     "Parameters file (ROS ros__parameters shape); sections for other nodes and /** keys the "
     "node does not have are ignored with a warning"),
    ("image", "image", "Input image topic (remaps `image`)"),
    ("camera_info", "camera_info", "Input camera_info topic (remaps `camera_info`)"),
    ("backend", "", "auto | cuda | cpu; empty: the config file's value (default auto)"),
    ("use_sim_time", "", "true | false: the node's clock follows /clock; empty: the config file's "
     "value (default false)"),
    ("log_level", "info", "Log level of the node: debug | info | warn | error | fatal"),
    ("respawn", "false", "true: start the node again when it exits (with gpu_failure_policy: exit)"),
    ("respawn_delay", "2.0", "Seconds before the node is started again (respawn:=true)"),
]

# Node parameters with a launch argument: passed only when the argument is not empty, after
# the config file (so a given argument wins, and an empty one changes nothing).
PARAMETER_ARGUMENTS = ["backend", "use_sim_time"]


def launch_node(context):
    def value(name: str) -> str:
        return LaunchConfiguration(name).perform(context)

    overrides = {name: yaml.safe_load(value(name)) for name in PARAMETER_ARGUMENTS if value(name) != ""}
    return [
        Node(
            package="vision_preproc",
            executable="vision_preproc_node",
            name="vision_preproc",
            namespace=value("namespace"),
            parameters=[value("config")] + ([overrides] if overrides else []),
            remappings=[("image", value("image")), ("camera_info", value("camera_info"))],
            ros_arguments=["--log-level", value("log_level")],
            respawn=value("respawn").lower() == "true",
            respawn_delay=float(value("respawn_delay")),
            output="screen",
        )
    ]


def generate_launch_description():
    return LaunchDescription([
        *[DeclareLaunchArgument(name, default_value=default, description=description)
          for name, default, description in ARGUMENTS],
        # No Fast DDS profile is set here: the node sizes its own shared-memory segment from
        # its output unless a profile is set (FASTRTPS_DEFAULT_PROFILES_FILE on Jazzy,
        # FASTDDS_DEFAULT_PROFILES_FILE from Kilted on). The camera driver is the one that
        # needs config/fastdds_large_frames.xml (see docs/QOS_AND_TRANSPORTS.md).
        OpaqueFunction(function=launch_node),
    ])
