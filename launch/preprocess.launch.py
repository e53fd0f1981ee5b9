"""Launch vision_preproc_node.

    ros2 launch vision_preproc preprocess.launch.py \
        namespace:=front_camera image:=/front_camera/image_raw \
        config:=$(ros2 pkg prefix vision_preproc)/share/vision_preproc/config/yolo_640_letterbox.yaml \
        backend:=auto

Every parameter and remapping passed here exists in the node (a test checks it).
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def generate_launch_description():
    share = get_package_share_directory("vision_preproc")
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="", description="Namespace of the node and its topics"),
        DeclareLaunchArgument("config", default_value=os.path.join(share, "config", "default.yaml"),
                              description="Parameters file (ROS ros__parameters shape)"),
        DeclareLaunchArgument("image", default_value="image", description="Input image topic (remaps `image`)"),
        DeclareLaunchArgument("camera_info", default_value="camera_info",
                              description="Input camera_info topic (remaps `camera_info`)"),
        DeclareLaunchArgument("backend", default_value="auto", description="auto | cuda | cpu"),
        # No Fast DDS profile is set here: the node sizes its own shared-memory segment from
        # its output unless FASTDDS_DEFAULT_PROFILES_FILE is set. The camera driver is the
        # one that needs config/fastdds_large_frames.xml (see the README).
        Node(
            package="vision_preproc",
            executable="vision_preproc_node",
            name="vision_preproc",
            namespace=LaunchConfiguration("namespace"),
            parameters=[LaunchConfiguration("config"), {"backend": LaunchConfiguration("backend")}],
            remappings=[("image", LaunchConfiguration("image")),
                        ("camera_info", LaunchConfiguration("camera_info"))],
            output="screen",
        ),
    ])
