"""Launch one vision_preproc_node batching four cameras into one TensorBatch.

    ros2 launch vision_preproc four_cameras.launch.py \
        front:=/cam_front/image_raw left:=/cam_left/image_raw \
        right:=/cam_right/image_raw rear:=/cam_rear/image_raw

The parameters come from `config` (default: config/four_cameras_640.yaml, whose `inputs`
are front/image_raw, left/image_raw, right/image_raw, rear/image_raw); each camera
argument remaps that input and its camera_info (`<camera>/camera_info`, next to the image
by image_transport's rule), so batch item i is always the i-th camera. Outputs: `tensor`
(TensorBatch), `timing`, `tensor/camera_info_<i>`, /diagnostics with each camera's rate,
drops and staleness.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

SHARE = FindPackageShare("vision_preproc")

# The inputs of config/four_cameras_640.yaml, in batch order (a test checks they agree).
CAMERAS = ["front", "left", "right", "rear"]

ARGUMENTS = [
    ("namespace", "", "Namespace of the node and its topics"),
    ("config", PathJoinSubstitution([SHARE, "config", "four_cameras_640.yaml"]),
     "Parameters file with `inputs` listing <camera>/image_raw for the four cameras"),
    *[(c, f"{c}/image_raw", f"Image topic of the {c} camera (batch item {i})") for i, c in enumerate(CAMERAS)],
    ("log_level", "info", "Log level of the node: debug | info | warn | error | fatal"),
]


def launch_node(context):
    def value(name: str) -> str:
        return LaunchConfiguration(name).perform(context)

    remappings = []
    for c in CAMERAS:
        image = value(c)
        info = image.rsplit("/", 1)[0] + "/camera_info" if "/" in image else "camera_info"
        remappings += [(f"{c}/image_raw", image), (f"{c}/camera_info", info)]
    return [
        Node(
            package="vision_preproc",
            executable="vision_preproc_node",
            name="vision_preproc",
            namespace=value("namespace"),
            parameters=[value("config")],
            remappings=remappings,
            ros_arguments=["--log-level", value("log_level")],
            output="screen",
        )
    ]


def generate_launch_description():
    return LaunchDescription([
        *[DeclareLaunchArgument(name, default_value=default, description=description)
          for name, default, description in ARGUMENTS],
        OpaqueFunction(function=launch_node),
    ])
