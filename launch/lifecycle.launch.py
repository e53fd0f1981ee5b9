"""Launch vision_preproc_lifecycle_node (the managed node) as launch_ros' LifecycleNode and
bring it to active, the way Nav2-style bringups do: configure at start, activate once it is
inactive (event handlers on its transition events).

    ros2 launch vision_preproc lifecycle.launch.py \
        namespace:=front_camera image:=/front_camera/image_raw \
        config:=$(ros2 pkg prefix vision_preproc)/share/vision_preproc/config/yolo_640_letterbox.yaml

`autostart:=false` starts it unconfigured (a lifecycle manager, or `ros2 lifecycle set`,
then drives it). docs/NODE.md, "The managed node", says what each state holds.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, RegisterEventHandler
from launch.conditions import IfCondition
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from launch_ros.substitutions import FindPackageShare
from lifecycle_msgs.msg import Transition

SHARE = FindPackageShare("vision_preproc")

ARGUMENTS = [
    ("namespace", "", "Namespace of the node and its topics"),
    ("config", PathJoinSubstitution([SHARE, "config", "default.yaml"]),
     "Parameters file (ROS ros__parameters shape)"),
    ("image", "image", "Input image topic (remaps `image`)"),
    ("camera_info", "camera_info", "Input camera_info topic (remaps `camera_info`)"),
    ("log_level", "info", "Log level of the node: debug | info | warn | error | fatal"),
    ("autostart", "true", "true: configure and activate at start; false: leave it unconfigured"),
]


def generate_launch_description():
    arg = LaunchConfiguration
    node = LifecycleNode(
        package="vision_preproc",
        executable="vision_preproc_lifecycle_node",
        name="vision_preproc",
        namespace=arg("namespace"),
        parameters=[arg("config")],
        remappings=[("image", arg("image")), ("camera_info", arg("camera_info"))],
        ros_arguments=["--log-level", arg("log_level")],
        output="screen",
    )
    autostart = IfCondition(arg("autostart"))
    configure = EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node),
                                            transition_id=Transition.TRANSITION_CONFIGURE), condition=autostart)
    # Once: a later configure (after a cleanup, by a manager or `ros2 lifecycle set`) leaves
    # it inactive, as for any managed node.
    activate = RegisterEventHandler(OnStateTransition(
        target_lifecycle_node=node, start_state="configuring", goal_state="inactive", handle_once=True,
        entities=[EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node),
                                              transition_id=Transition.TRANSITION_ACTIVATE))]),
        condition=autostart)
    return LaunchDescription([
        *[DeclareLaunchArgument(name, default_value=default, description=description)
          for name, default, description in ARGUMENTS],
        activate,
        node,
        configure,
    ])


