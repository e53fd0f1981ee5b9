"""The launch files: both declare the same arguments (names, defaults, descriptions), the
XML one includes the Python one with all of them, the Python one passes a parameter
argument only when it is given (so the `config:=` file's value holds otherwise) and only
parameters and remappings the node has; and the node started exactly as the Python file
starts it (same executable from the colcon install, parameters files in the same order,
remappings, log level) has the parameters it should.

`ros2 launch` (launch, launch_ros) is not installable here, so preprocess.launch.py is
executed with small stand-ins for the launch classes it uses (below: argument defaults,
`LaunchConfiguration.perform`, `OpaqueFunction`, `FindPackageShare`, and a `Node` that
records its arguments), and the node's command line is built from those arguments the way
launch_ros builds it (`--ros-args`, the ROS arguments, `-r __node:=`, `-r __ns:=`, one
`--params-file` per entry of `parameters` in order, a dict written as a file keyed by the
node's full name, `-r from:=to`)."""

from __future__ import annotations

import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml
from rcl_interfaces.srv import GetParameters
from sensor_msgs.msg import Image

from vptools.rosharness import ROOT, NodeProcess, Peer, image_msg
from vptools.sources import photo_bgr

LAUNCH = ROOT / "launch"


def node_parameters() -> set[str]:
    """The node's parameters: the shipped default parameters file (a Rust test asserts it
    equals the code's defaults) and use_sim_time."""
    doc = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    params = doc["vision_preproc"]["ros__parameters"]

    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    return set(flat(params)) | {"use_sim_time"}


# ---------------------------------------------------------------- stand-ins for launch

class _Subst:
    def perform(self, context) -> str:
        raise NotImplementedError


def _perform(value, context) -> str:
    return value.perform(context) if isinstance(value, _Subst) else str(value)


class LaunchConfiguration(_Subst):
    def __init__(self, name: str):
        self.name = name

    def perform(self, context) -> str:
        return context["args"][self.name]


class FindPackageShare(_Subst):
    def __init__(self, package: str):
        self.package = package

    def perform(self, context) -> str:
        return context["share"]

    def __str__(self) -> str:  # how launch XML writes it
        return f"$(find-pkg-share {self.package})"


class PathJoinSubstitution(_Subst):
    def __init__(self, parts):
        self.parts = parts

    def perform(self, context) -> str:
        return "/".join(_perform(p, context) for p in self.parts)

    def __str__(self) -> str:
        return "/".join(str(p) for p in self.parts)


class EnvironmentVariable(_Subst):
    def __init__(self, name, default_value=""):
        self.name, self.default_value = name, default_value


class FindPackagePrefix(_Subst):
    def __init__(self, package: str):
        self.package = package

    def perform(self, context) -> str:
        return context["prefix"]


class PythonExpression(_Subst):
    def __init__(self, parts):
        self.parts = parts

    def perform(self, context) -> str:
        return str(eval(_perform_all(self.parts, context)))  # noqa: S307 - launch's own rule


def _perform_all(value, context) -> str:
    """A launch value: a string, a substitution or a list of them (concatenated)."""
    if isinstance(value, (list, tuple)):
        return "".join(_perform(v, context) for v in value)
    return _perform(value, context)


class _Action:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _stub_modules() -> dict:
    mods = {name: types.ModuleType(name) for name in
            ["launch", "launch.actions", "launch.conditions", "launch.launch_description_sources",
             "launch.substitutions", "launch_ros", "launch_ros.actions", "launch_ros.substitutions"]}
    mods["launch"].LaunchDescription = lambda entities: list(entities)
    for name in ["DeclareLaunchArgument", "OpaqueFunction", "SetEnvironmentVariable", "ExecuteProcess",
                 "GroupAction", "IncludeLaunchDescription"]:
        setattr(mods["launch.actions"], name, type(name, (_Action,), {}))
    mods["launch.conditions"].UnlessCondition = type("UnlessCondition", (_Action,), {})
    mods["launch.launch_description_sources"].PythonLaunchDescriptionSource = \
        type("PythonLaunchDescriptionSource", (_Action,), {})
    for cls in [LaunchConfiguration, PathJoinSubstitution, EnvironmentVariable, PythonExpression]:
        setattr(mods["launch.substitutions"], cls.__name__, cls)
    mods["launch_ros.actions"].Node = type("Node", (_Action,), {})
    for name in ["PushROSNamespace", "SetParameter"]:
        setattr(mods["launch_ros.actions"], name, type(name, (_Action,), {}))
    mods["launch_ros.substitutions"].FindPackageShare = FindPackageShare
    mods["launch_ros.substitutions"].FindPackagePrefix = FindPackagePrefix
    return mods


def load_python_launch(name: str = "preprocess.launch.py"):
    """A Python launch file (preprocess.launch.py) as a module, with the stand-ins."""
    saved = {k: sys.modules.get(k) for k in _stub_modules()}
    sys.modules.update(_stub_modules())
    try:
        module = types.ModuleType(name.replace(".", "_"))
        source = (LAUNCH / name).read_text()
        exec(compile(source, str(LAUNCH / name), "exec"), module.__dict__)  # noqa: S102
        return module
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def python_arguments() -> list[tuple[str, str, str]]:
    """(name, default as launch XML writes it, description) of each declared argument."""
    ld = load_python_launch().generate_launch_description()
    declared = [a for a in ld if type(a).__name__ == "DeclareLaunchArgument"]
    return [(a.args[0], str(a.kwargs["default_value"]), a.kwargs["description"]) for a in declared]


def _declare_arguments(ld, context: dict, args: dict[str, str], name: str) -> None:
    """The launch description's arguments into `context["args"]`: each declared one's
    default, then `args` (which must all be declared)."""
    for a in ld:
        if type(a).__name__ == "DeclareLaunchArgument":
            context["args"][a.args[0]] = _perform(a.kwargs["default_value"], context)
    unknown = set(args) - set(context["args"])
    assert not unknown, f"not arguments of {name}: {unknown}"
    context["args"].update(args)


def run_python_launch(args: dict[str, str], share: Path, name: str = "preprocess.launch.py") -> dict:
    """Run a Python launch file (preprocess.launch.py) with launch arguments `args`
    (name:=value); return the keyword arguments of the Node it starts."""
    ld = load_python_launch(name).generate_launch_description()
    context = {"args": {}, "share": str(share)}
    _declare_arguments(ld, context, args, name)
    nodes = []
    for a in ld:
        if type(a).__name__ == "OpaqueFunction":
            nodes += a.kwargs["function"](context)
    assert len(nodes) == 1 and type(nodes[0]).__name__ == "Node", nodes
    return nodes[0].kwargs


def ros_arguments(node: dict, tmp: Path) -> list[str]:
    """The arguments after `--ros-args` that launch_ros gives the node's process."""
    ns = "/" + node["namespace"].strip("/") if node["namespace"] else ""
    fqn = f"{ns}/{node['name']}"
    out = list(node["ros_arguments"]) + ["-r", f"__node:={node['name']}"]
    if ns:
        out += ["-r", f"__ns:={ns}"]
    for i, p in enumerate(node["parameters"]):
        if isinstance(p, dict):
            path = tmp / f"launch_params_{i}.yaml"
            path.write_text(yaml.dump({fqn: {"ros__parameters": p}}))
            p = path
        out += ["--params-file", str(p)]
    for a, b in node["remappings"]:
        out += ["-r", f"{a}:={b}"]
    return out


def xml_launch() -> dict:
    root = ET.parse(LAUNCH / "preprocess.launch.xml").getroot()
    includes = root.findall("include")
    return {
        "args": [(a.get("name"), a.get("default"), a.get("description")) for a in root.findall("arg")],
        "include": [i.get("file") for i in includes],
        "forwarded": {a.get("name"): a.get("value") for i in includes for a in i.findall("arg")},
        "others": [e.tag for e in root if e.tag not in ("arg", "include")],
    }


# ---------------------------------------------------------------- tests

def test_xml_and_python_launch_files_declare_the_same_arguments() -> None:
    py, xml = python_arguments(), xml_launch()
    assert xml["args"] == py, f"\nXML:    {xml['args']}\nPython: {py}"
    names = [a[0] for a in py]
    assert {"namespace", "config", "image", "camera_info", "backend", "use_sim_time", "log_level",
            "respawn", "respawn_delay"} <= set(names)
    # The XML file starts the node through the Python file, with every argument.
    assert xml["include"] == ["$(find-pkg-share vision_preproc)/launch/preprocess.launch.py"]
    assert xml["forwarded"] == {n: f"$(var {n})" for n in names}
    assert xml["others"] == []
    defaults = {a[0]: a[1] for a in py}
    assert defaults["config"] == "$(find-pkg-share vision_preproc)/config/default.yaml"
    assert (defaults["backend"], defaults["use_sim_time"]) == ("", "")


def test_parameter_arguments_are_passed_only_when_given(tmp_path: Path) -> None:
    share = ROOT  # config/ is where the installed share/vision_preproc/config/ comes from
    node = run_python_launch({}, share)
    assert (node["package"], node["executable"], node["name"]) == ("vision_preproc", "vision_preproc_node",
                                                                   "vision_preproc")
    # Nothing given: the config file only (the node's defaults for what it does not set).
    assert node["parameters"] == [f"{ROOT}/config/default.yaml"]
    assert (node["respawn"], node["respawn_delay"], node["ros_arguments"]) == (False, 2.0, ["--log-level", "info"])
    assert node["remappings"] == [("image", "image"), ("camera_info", "camera_info")]
    # Given: after the file, typed as YAML types them.
    node = run_python_launch({"backend": "cpu", "use_sim_time": "true", "log_level": "debug", "respawn": "true",
                              "respawn_delay": "0.5", "config": "/x.yaml"}, share)
    assert node["parameters"] == ["/x.yaml", {"backend": "cpu", "use_sim_time": True}]
    assert (node["respawn"], node["respawn_delay"], node["ros_arguments"]) == (True, 0.5, ["--log-level", "debug"])
    # Every parameter a launch file can pass exists in the node.
    module = load_python_launch()
    assert set(module.PARAMETER_ARGUMENTS) <= node_parameters()
    assert set(module.PARAMETER_ARGUMENTS) <= {a[0] for a in python_arguments()}


def test_four_camera_launch_file_and_preset() -> None:
    """four_cameras.launch.py: the preset's inputs are its cameras, in batch order; each
    camera argument remaps that input and its camera_info; the preset is a valid node
    configuration (check-config reads it as the node does)."""
    import subprocess

    node = run_python_launch({"front": "/cf/image_raw", "rear": "/cr/image"}, ROOT, "four_cameras.launch.py")
    assert node["parameters"] == [f"{ROOT}/config/four_cameras_640.yaml"]
    preset = yaml.safe_load((ROOT / "config" / "four_cameras_640.yaml").read_text())["vision_preproc"]["ros__parameters"]
    cameras = load_python_launch("four_cameras.launch.py").CAMERAS
    assert preset["inputs"] == [f"{c}/image_raw" for c in cameras] and len(cameras) == 4
    assert set(preset) <= node_parameters()
    remap = dict(node["remappings"])
    assert remap["front/image_raw"] == "/cf/image_raw" and remap["front/camera_info"] == "/cf/camera_info"
    assert remap["rear/image_raw"] == "/cr/image" and remap["rear/camera_info"] == "/cr/camera_info"
    assert remap["left/image_raw"] == "left/image_raw" and remap["left/camera_info"] == "left/camera_info"
    cli = ROOT / "target" / "release" / "vision_preproc"
    out = subprocess.run([str(cli), "check-config", str(ROOT / "config" / "four_cameras_640.yaml")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "batch_policy: latest" in out.stdout, out.stdout + out.stderr


def get_params(peer: Peer, node: str, names: list[str]) -> list:
    client = peer.node.create_client(GetParameters, f"{node}/get_parameters")
    peer.spin_until(client.service_is_ready, 10, "get_parameters")
    future = client.call_async(GetParameters.Request(names=names))
    peer.spin_until(future.done, 10, "get_parameters reply")
    return future.result().values


def test_node_started_as_the_launch_file_starts_it(tmp_path: Path, colcon_install: Path) -> None:
    """namespace:=lf image:=/lf_cam/image_raw config:=<installed yolo preset + backend: cpu>:
    the file's backend holds (no backend argument); then with the file saying `backend:
    cuda` and backend:=cpu given, the argument wins (on this GPU-less machine the node
    would exit otherwise)."""
    share = colcon_install / "vision_preproc" / "share" / "vision_preproc"
    exe = colcon_install / "vision_preproc" / "lib" / "vision_preproc" / "vision_preproc_node"
    preset = (share / "config" / "yolo_640_letterbox.yaml").read_text()
    for case, (file_backend, launch_args) in enumerate([("cpu", {}), ("cuda", {"backend": "cpu"})]):
        config = tmp_path / f"config{case}.yaml"
        config.write_text(preset.replace("ros__parameters:", f"ros__parameters:\n    backend: {file_backend}", 1))
        node = run_python_launch({"namespace": "lf", "image": "/lf_cam/image_raw",
                                  "camera_info": "/lf_cam/camera_info", "config": str(config), **launch_args}, share)
        with NodeProcess(ros_arguments(node, tmp_path), binary=exe, log=tmp_path / f"node{case}.log") as proc:
            peer = Peer("/lf")
            # Publish on the remapped input topic instead of /lf/image.
            peer.pub = peer.node.create_publisher(Image, "/lf_cam/image_raw", peer.image_qos)
            try:
                peer.wait_connected()
                values = get_params(peer, "/lf/vision_preproc", ["backend", "tensor_name", "network_image_width"])
                assert (values[0].string_value, values[1].string_value, values[2].integer_value) == \
                    ("cpu", "images", 640), (case, proc.output())
                t = peer.send_until_received(image_msg(photo_bgr("chelsea.png"), "bgr8",
                                                       5_000_000_001 + case, "cam"))
                assert list(t.shape) == [1, 3, 640, 640] and t.name == "images"
            finally:
                peer.close()
            assert proc.stop() == 0, proc.output()


# ---------------------------------------------------------------- the robot bringup example

BRINGUP = "examples/robot_bringup.launch.py"


def run_bringup(args: dict[str, str], share: Path, prefix: Path) -> dict:
    """Evaluate examples/robot_bringup.launch.py as launch does, with the stand-ins: the
    pushed namespace, the global parameters, the included file with its arguments, the
    bag player (or None when its condition says no), and the Node the included
    preprocess.launch.py starts."""
    ld = load_python_launch(BRINGUP).generate_launch_description()
    context = {"args": {}, "share": str(share), "prefix": str(prefix)}
    _declare_arguments(ld, context, args, BRINGUP)
    groups = [a for a in ld if type(a).__name__ == "GroupAction"]
    assert len(groups) == 1, ld
    out: dict = {"namespace": [], "global": {}, "include": None, "player": None}
    for a in groups[0].args[0]:
        kind = type(a).__name__
        if kind == "PushROSNamespace":
            out["namespace"].append(_perform_all(a.args[0], context))
        elif kind == "SetParameter":
            out["global"][a.kwargs["name"]] = _perform_all(a.kwargs["value"], context)
        elif kind == "IncludeLaunchDescription":
            path = _perform_all(a.args[0].args[0], context)
            out["include"] = (path, {k: _perform_all(v, context) for k, v in a.kwargs["launch_arguments"]})
        elif kind == "ExecuteProcess":
            condition = a.kwargs.get("condition")
            skip = condition is not None and _perform_all(condition.args[0], context) == "True"
            out["player"] = None if skip else [_perform_all(c, context) for c in a.kwargs["cmd"]]
        else:
            raise AssertionError(f"{BRINGUP}: an action the test does not model: {kind}")
    path, forwarded = out["include"]
    assert path == f"{share}/launch/preprocess.launch.py", path
    out["node"] = run_python_launch(forwarded, share)
    out["forwarded"] = forwarded
    return out


def test_robot_bringup_example_includes_ours_as_a_bringup_does(tmp_path: Path) -> None:
    """The example bringup (docs/NODE.md, "In a robot's bringup"): robot namespace, shared
    parameters file, sim time for every node, our launch file included with the camera
    remapped and respawn on; the bag player only with bag:=, publishing with --clock where
    the node listens. Then the node started exactly so (launch_ros's command line, as the
    real `ros2 launch` printed it) has the values of its section of the shared file, found
    by its full name, and use_sim_time from the bringup."""
    prefix = Path("/opt/robot")
    run = run_bringup({}, ROOT, prefix)
    assert run["player"] is None  # no bag: a real camera
    run = run_bringup({"bag": "/bags/drive", "use_sim_time": "true", "robot": "r2"}, ROOT, prefix)
    node, ns = run["node"], "/" + "/".join(n.strip("/") for n in run["namespace"])
    fqn = f"{ns}/{node['namespace']}/{node['name']}"
    assert fqn == "/r2/perception/vision_preproc", fqn
    assert run["global"] == {"use_sim_time": "true"}
    assert (node["respawn"], node["respawn_delay"]) == (True, 1.0)
    remap = dict(node["remappings"])
    assert remap == {"image": "/r2/front_camera/image_raw", "camera_info": "/r2/front_camera/camera_info"}
    player = run["player"]
    assert player[0] == f"{prefix}/lib/vision_preproc/vision_preproc" and player[1:3] == ["play", "/bags/drive"]
    assert "--clock" in player and "--loop" in player
    assert player[player.index("--image-topic") + 1] == remap["image"]
    assert player[player.index("--camera-info-topic") + 1] == remap["camera_info"]
    # Every argument forwarded is one of preprocess.launch.py's.
    assert set(run["forwarded"]) <= {a[0] for a in python_arguments()}

    # The shipped shared file: a /** section and a section keyed by the node's full name
    # under the default robot namespace (rclcpp, rclpy and the node all match that form).
    run = run_bringup({"use_sim_time": "true"}, ROOT, prefix)
    node = run["node"]
    assert node["parameters"] == [f"{ROOT}/config/examples/robot_params.yaml"]
    shared = yaml.safe_load(Path(node["parameters"][0]).read_text())
    fqn = f"/{run['namespace'][0]}/{node['namespace']}/{node['name']}"
    assert "/**" in shared and fqn in shared, (fqn, list(shared))
    ours = shared[fqn]["ros__parameters"]
    assert set(ours) <= node_parameters()
    # launch_ros's command line: the global parameter after the names, then the files.
    ros_args = ros_arguments(dict(node, namespace=f"/{run['namespace'][0]}/{node['namespace']}"), tmp_path)
    at = ros_args.index("--params-file")
    ros_args[at:at] = ["-p", f"use_sim_time:={run['global']['use_sim_time']}"]
    with NodeProcess(ros_args, log=tmp_path / "bringup_node.log") as proc:
        peer = Peer(f"/{run['namespace'][0]}/{node['namespace']}", publish_images=False)
        try:
            names = sorted(ours) + ["use_sim_time"]
            values = get_params(peer, fqn, names)
            got = {n: _param_value(v) for n, v in zip(names, values)}
        finally:
            peer.close()
        assert proc.stop() == 0, proc.output()
    for name, want in ours.items():
        assert got[name] == want, (name, got[name], want, proc.output())
    assert got["use_sim_time"] is True
    assert "`robot_description_frame_prefix` is not a parameter" in proc.output()


def _param_value(v):
    """A ParameterValue as the YAML value it was given as (integers in a double array as
    YAML writes them compare equal)."""
    kind = v.type
    return {1: lambda: v.bool_value, 2: lambda: v.integer_value, 3: lambda: v.double_value,
            4: lambda: v.string_value, 7: lambda: list(v.integer_array_value),
            8: lambda: list(v.double_array_value), 9: lambda: list(v.string_array_value)}[kind]()


def test_wildcard_sections_of_a_parameters_file_apply_as_in_rclcpp(tmp_path: Path) -> None:
    """A shared file with rclcpp's wildcards (`/**` any namespaces, `/*` one token): the
    sections that match the node's full name apply, in file order; others do not."""
    params = tmp_path / "shared.yaml"
    params.write_text(
        "/**/vision_preproc:\n  ros__parameters:\n    network_image_height: 256\n    tensor_name: any_depth\n"
        "/wild/*/vision_preproc:\n  ros__parameters:\n    tensor_name: one_token\n"
        "/other/**:\n  ros__parameters:\n    network_image_width: 99\n"
        "/wild/*:\n  ros__parameters:\n    output_dtype: float16\n")
    with NodeProcess(["-r", "__ns:=/wild/front", "-p", "backend:=cpu", "--params-file", str(params)],
                     log=tmp_path / "node.log") as proc:
        peer = Peer("/wild/front", publish_images=False)
        try:
            values = get_params(peer, "/wild/front/vision_preproc",
                                ["network_image_height", "tensor_name", "network_image_width", "output_dtype"])
        finally:
            peer.close()
        assert proc.stop() == 0, proc.output()
    got = [_param_value(v) for v in values]
    # /wild/* is one token: it names a node /wild/<name>, not /wild/front/vision_preproc.
    assert got == [256, "one_token", 640, "float32"], (got, proc.output())
