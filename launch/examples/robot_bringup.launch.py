"""Example: vision_preproc inside a robot's bringup, the way robot stacks include a node.

    ros2 launch vision_preproc robot_bringup.launch.py \
        bag:=<a rosbag2 folder> use_sim_time:=true

What a bringup does, and this file shows:
- everything of the robot under its namespace (`robot`, default `robot1`; PushROSNamespace);
- one shared parameters file for all the robot's nodes (`params_file`, default
  config/examples/robot_params.yaml: a `/**` section and one section per node, keyed by
  the node's full name);
- `use_sim_time` for every node of the robot (SetParameter), with the clock from a bag
  played with `--clock`;
- our preprocess.launch.py included with the camera's topics remapped and
  `respawn:=true`: a killed or crashed node is started again after `respawn_delay`.

The node ends up as /<robot>/perception/vision_preproc, reading
/<robot>/front_camera/image_raw and camera_info, publishing /<robot>/perception/tensor.
`bag:=` plays a bag as the robot's front camera, with /clock, using this package's
`vision_preproc play --clock` (on a ROS 2 installed from apt, `ros2 bag play --clock
--loop BAG --remap /camera/image_raw:=/robot1/front_camera/image_raw ...` does the same).
docs/NODE.md, "In a robot's bringup", has a run of this file with the real `ros2 launch`.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, GroupAction, IncludeLaunchDescription
from launch.conditions import UnlessCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import PushROSNamespace, SetParameter
from launch_ros.substitutions import FindPackagePrefix, FindPackageShare

SHARE = FindPackageShare("vision_preproc")

# name, default, description
ARGUMENTS = [
    ("robot", "robot1", "Namespace of the robot: every node and topic of the bringup is under it"),
    ("params_file", PathJoinSubstitution([SHARE, "config", "examples", "robot_params.yaml"]),
     "The robot's shared parameters file (/** and one section per node, by full name)"),
    ("camera", "front_camera", "Namespace of the camera driver under the robot (its image_raw, camera_info)"),
    ("use_sim_time", "false", "true: every node of the robot follows /clock (with bag:=, or a simulator)"),
    ("bag", "", "A rosbag2 folder played as the camera, looped, with --clock; empty: a real camera"),
    ("respawn_delay", "1.0", "Seconds before a node that died is started again"),
]


def generate_launch_description():
    robot, camera = LaunchConfiguration("robot"), LaunchConfiguration("camera")
    camera_topic = ["/", robot, "/", camera, "/"]
    preprocess = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([SHARE, "launch", "preprocess.launch.py"])),
        launch_arguments={
            "namespace": "perception",  # relative: under the pushed robot namespace
            "config": LaunchConfiguration("params_file"),
            "image": camera_topic + ["image_raw"],
            "camera_info": camera_topic + ["camera_info"],
            "respawn": "true",
            "respawn_delay": LaunchConfiguration("respawn_delay"),
        }.items(),
    )
    player = ExecuteProcess(
        cmd=[PathJoinSubstitution([FindPackagePrefix("vision_preproc"), "lib", "vision_preproc", "vision_preproc"]),
             "play", LaunchConfiguration("bag"), "--loop", "--clock",
             "--image-topic", camera_topic + ["image_raw"], "--camera-info-topic", camera_topic + ["camera_info"]],
        name="bag_player",
        output="screen",
        condition=UnlessCondition(PythonExpression(["'", LaunchConfiguration("bag"), "' == ''"])),
    )
    return LaunchDescription([
        *[DeclareLaunchArgument(name, default_value=default, description=description)
          for name, default, description in ARGUMENTS],
        GroupAction([
            PushROSNamespace(robot),
            SetParameter(name="use_sim_time", value=LaunchConfiguration("use_sim_time")),
            preprocess,
            player,
        ]),
    ])
