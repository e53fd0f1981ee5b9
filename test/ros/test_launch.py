"""The launch files pass only parameters and remappings the node has, and the node
started exactly as they would start it (same executable from the colcon install, same
parameters file, same parameter overrides, same remappings) works. `ros2 launch` itself
is not installable here, so the launch files are read, not executed."""

from __future__ import annotations

import ast
import xml.etree.ElementTree as ET
from pathlib import Path

import cv2
import yaml
from sensor_msgs.msg import Image

from vptools.rosharness import ROOT, NodeProcess, Peer, image_msg

LAUNCH = ROOT / "launch"


def node_parameters() -> set[str]:
    """The node's parameters, from the shipped default parameters file (a Rust test
    asserts it equals the code's defaults)."""
    doc = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    params = doc["vision_preproc"]["ros__parameters"]

    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    return set(flat(params))


def python_launch() -> dict:
    """Executable, name, default config, parameter names and remapped topics of the Node
    action in preprocess.launch.py (read with ast)."""
    tree = ast.parse((LAUNCH / "preprocess.launch.py").read_text())
    out = {"params": set(), "remaps": set(), "args": {}}
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        fn = getattr(call.func, "id", getattr(call.func, "attr", ""))
        kw = {k.arg: k.value for k in call.keywords}
        if fn == "DeclareLaunchArgument":
            out["args"][ast.literal_eval(call.args[0])] = kw.get("default_value")
        if fn == "Node":
            out["executable"] = ast.literal_eval(kw["executable"])
            out["package"] = ast.literal_eval(kw["package"])
            out["name"] = ast.literal_eval(kw["name"])
            for item in kw["parameters"].elts:
                if isinstance(item, ast.Dict):
                    out["params"] |= {ast.literal_eval(k) for k in item.keys}
            for pair in kw["remappings"].elts:
                out["remaps"].add(ast.literal_eval(pair.elts[0]))
    return out


def xml_launch() -> dict:
    root = ET.parse(LAUNCH / "preprocess.launch.xml").getroot()
    node = root.find("node")
    return {
        "executable": node.get("exec"),
        "package": node.get("pkg"),
        "name": node.get("name"),
        "params": {p.get("name") for p in node.findall("param") if p.get("name")},
        "param_files": [p.get("from") for p in node.findall("param") if p.get("from")],
        "remaps": {r.get("from") for r in node.findall("remap")},
        "args": {a.get("name"): a.get("default") for a in root.findall("arg")},
    }


def test_launch_files_pass_only_what_the_node_has() -> None:
    params = node_parameters()
    for launch in [python_launch(), xml_launch()]:
        assert (launch["package"], launch["executable"], launch["name"]) == (
            "vision_preproc", "vision_preproc_node", "vision_preproc")
        assert launch["params"] <= params, f"unknown parameters: {launch['params'] - params}"
        assert launch["remaps"] == {"image", "camera_info"}, launch["remaps"]
        assert {"namespace", "config", "image", "camera_info", "backend"} <= set(launch["args"])
    assert xml_launch()["param_files"] == ["$(var config)"]
    assert "default.yaml" in xml_launch()["args"]["config"]


def test_node_started_as_the_launch_files_start_it(tmp_path: Path, colcon_install: Path) -> None:
    """namespace:=lf image:=/lf_cam/image_raw config:=<installed yolo preset> backend:=cpu"""
    share = colcon_install / "vision_preproc" / "share" / "vision_preproc"
    exe = colcon_install / "vision_preproc" / "lib" / "vision_preproc" / "vision_preproc_node"
    config = share / "config" / "yolo_640_letterbox.yaml"
    assert config.exists()
    args = ["-r", "__node:=vision_preproc", "-r", "__ns:=/lf", "--params-file", str(config),
            "-p", "backend:=cpu", "-r", "image:=/lf_cam/image_raw", "-r", "camera_info:=/lf_cam/camera_info"]
    with NodeProcess(args, binary=exe, log=tmp_path / "node.log") as node:
        peer = Peer("/lf")
        # Publish on the remapped input topic instead of /lf/image.
        peer.pub = peer.node.create_publisher(Image, "/lf_cam/image_raw", peer.image_qos)
        try:
            peer.wait_connected()
            # The graph learns the node's name a little after its endpoints match.
            peer.spin_until(lambda: ("vision_preproc", "/lf") in peer.node.get_node_names_and_namespaces(),
                            10, "the node's name in the ROS graph")
            subs: dict = {}
            peer.spin_until(lambda: subs.update(peer.node.get_subscriber_names_and_types_by_node(
                "vision_preproc", "/lf")) or {"/lf_cam/image_raw", "/lf_cam/camera_info"} <= set(subs),
                10, "the node's remapped subscriptions")
            t = peer.send_until_received(image_msg(cv2.imread(str(ROOT / "test/data/chelsea.png")), "bgr8", 5_000_000_001, "cam"))
            assert list(t.shape) == [1, 3, 640, 640] and t.name == "images"
        finally:
            peer.close()
        assert node.stop() == 0
