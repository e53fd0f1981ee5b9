"""config/aggregator/vision_preproc_analyzers.yaml against the statuses real nodes publish.

diagnostic_aggregator (a C++ package: rclcpp, pluginlib) has no PyPI wheel, so its
aggregator_node cannot run here (docs/WATCHING.md). This test reads the file as the
aggregator reads its parameters (`analyzers: ros__parameters:`, AnalyzerGroup with nested
`analyzers`, GenericAnalyzer with `path`, `regex`, `startswith`, `contains`, `name`,
`expected`, `timeout` as generic_analyzer.cpp parses them: string arrays) and applies
GenericAnalyzer::match (regex by std::regex_match, i.e. the whole name) to the status
names that real nodes publish on /diagnostics: one camera at the root and in a namespace,
four cameras batched in a nested namespace (which adds one status per camera), and the
greenwave statuses, one per output topic named after it. The names come from those nodes,
not from a list here.
"""

from __future__ import annotations

import re
from pathlib import Path

import rclpy
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node

from vptools.rosharness import ROOT, NodeProcess

CONFIG = ROOT / "config" / "aggregator" / "vision_preproc_analyzers.yaml"
# The analyzer types of diagnostic_aggregator's plugin_description.xml that the file may use.
TYPES = {"diagnostic_aggregator/AnalyzerGroup", "diagnostic_aggregator/GenericAnalyzer",
         "diagnostic_aggregator/DiscardAnalyzer", "diagnostic_aggregator/IgnoreAnalyzer"}
STRING_ARRAYS = ("regex", "startswith", "contains", "name", "expected", "remove_prefix", "find_and_remove_prefix")


def generic_analyzers(params: dict, path: str = "") -> list[tuple[str, dict]]:
    """(full path, parameters) of each GenericAnalyzer under `params`, through AnalyzerGroups."""
    out = []
    for key, value in params.items():
        if not isinstance(value, dict):
            continue
        assert value.get("type") in TYPES, f"{CONFIG.name}: analyzer {key}: type {value.get('type')!r}"
        assert isinstance(value.get("path"), str), f"{CONFIG.name}: analyzer {key} has no path"
        full = f"{path}/{value['path']}"
        if value["type"] == "diagnostic_aggregator/AnalyzerGroup":
            out += generic_analyzers(value["analyzers"], full)
        elif value["type"] == "diagnostic_aggregator/GenericAnalyzer":
            for p in STRING_ARRAYS:  # generic_analyzer.cpp reads them with as_string_array()
                assert p not in value or (isinstance(value[p], list) and all(isinstance(s, str) for s in value[p])), \
                    f"{CONFIG.name}: {key}.{p} must be a list of strings"
            out.append((full, value))
    return out


def matches(analyzer: dict, name: str) -> bool:
    """GenericAnalyzer::match (generic_analyzer.cpp): regex (whole name), expected, name,
    startswith, contains."""
    return (any(re.fullmatch(r, name) for r in analyzer.get("regex", []))
            or name in analyzer.get("expected", []) or name in analyzer.get("name", [])
            or any(name.startswith(s) for s in analyzer.get("startswith", []))
            or any(s in name for s in analyzer.get("contains", [])))


def published_statuses(seconds: float, want: int) -> dict[str, set[int]]:
    """Status name -> levels seen on /diagnostics, until `want` names (or `seconds`)."""
    import time

    context = rclpy.Context()
    rclpy.init(context=context)
    node = Node("aggregator_check", context=context)
    seen: dict[str, set[int]] = {}

    def on(msg: DiagnosticArray) -> None:
        for s in msg.status:
            level = s.level[0] if isinstance(s.level, bytes) else s.level  # `byte` in rclpy
            seen.setdefault(s.name, set()).add(level)

    node.create_subscription(DiagnosticArray, "/diagnostics", on, 10)
    executor = rclpy.executors.SingleThreadedExecutor(context=context)
    executor.add_node(node)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (len(seen) < want or min(len(v) for v in seen.values()) < 1):
        executor.spin_once(timeout_sec=0.1)
    # One more second: a status that changes level (the batched node's cameras go stale).
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.1)
    node.destroy_node()
    rclpy.shutdown(context=context)
    return seen


def test_aggregator_analyzers_group_every_node_status(tmp_path: Path) -> None:
    doc = yaml.safe_load(CONFIG.read_text())
    assert list(doc) == ["analyzers"] and list(doc["analyzers"]) == ["ros__parameters"], list(doc)
    analyzers = generic_analyzers(doc["analyzers"]["ros__parameters"])
    assert analyzers, "no GenericAnalyzer"
    nodes = [
        ["-p", "backend:=cpu"],
        ["-p", "backend:=cpu", "-r", "__ns:=/agg_front_camera"],
        ["--params-file", str(ROOT / "config" / "four_cameras_640.yaml"), "-p", "backend:=cpu",
         "-r", "__ns:=/agg_robot/perception"],
    ]
    procs = [NodeProcess(args, log=tmp_path / f"node{i}.log") for i, args in enumerate(nodes)]
    for p in procs:
        p.__enter__()
    try:
        # Three node statuses, one per camera of the batched node, two topics per node.
        seen = published_statuses(20.0, len(nodes) * 3 + 4)
    finally:
        for p in procs:
            p.__exit__(None, None, None)
    # The greenwave statuses (their names are topics: a leading slash), each node's two.
    topics = sorted(n for n in seen if n.startswith("/"))
    assert topics == sorted(f"{ns}/{t}" for ns in ["", "/agg_front_camera", "/agg_robot/perception"]
                            for t in ["tensor", "tensor_ref"]), topics
    ours = sorted(n for n in seen if not n.startswith("/"))
    batched = "agg_robot/perception/vision_preproc"
    cameras = [f"{batched}: camera {i}" for i in range(4)]
    assert ours == sorted(["vision_preproc", "agg_front_camera/vision_preproc", batched, *cameras]), \
        (ours, [p.output()[-2000:] for p in procs])
    # Each node status is named after its node's full name; the batched node's cameras
    # never send: it and each camera WARN (stale), the others are OK.
    assert seen[batched] == {1} and all(seen[c] == {1} for c in cameras), seen
    assert seen["agg_front_camera/vision_preproc"] == {0} and seen["vision_preproc"] == {0}, seen
    placed = {}
    for name in ours:
        placed[name] = [path for path, a in analyzers if matches(a, name)]
        assert len(placed[name]) == 1, f"status {name!r} is grouped under {placed[name]} (want exactly one analyzer)"
    for name in topics:
        placed[name] = [path for path, a in analyzers if matches(a, name)]
        assert len(placed[name]) == 1, f"status {name!r} is grouped under {placed[name]} (want exactly one analyzer)"
    # Nodes in one group, their cameras in another, the topics in a third.
    groups = [{placed[n][0] for n in ours if n not in cameras}, {placed[c][0] for c in cameras},
              {placed[t][0] for t in topics}]
    assert all(len(g) == 1 for g in groups) and len(set.union(*groups)) == 3, placed
    # And nothing else: a node merely named alike is not grouped with them.
    for stranger in ["vision_preproc_monitor", "camera/vision_preproc_bridge", "vision_preprocessor",
                     "/camera/image_raw", "/tensor_refs"]:
        assert not any(matches(a, stranger) for _, a in analyzers), stranger
