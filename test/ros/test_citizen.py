"""The node as ROS tools see it, through real DDS with rclpy as the peer: /rosout (log
records with the node's logger name, levels from --log-level), /parameter_events on every
change, full parameter descriptors (ranges, read_only), refusals in ROS words, integers
for doubles, rules between parameters in one request in any order, use_sim_time (at start
and at run time) with FrameTiming.age_us and /diagnostics following /clock, and a shared
parameters file (/** and other nodes' sections, unknown keys warned about and ignored)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from vptools.rosharness import RELIABLE, ROOT, NodeProcess, Peer, call, image_msg, param, stamp_ns, tensor_array

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Log, Parameter, ParameterEvent, ParameterType
from rcl_interfaces.srv import DescribeParameters, GetParameters, ListParameters, SetParameters
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from vptools.oracle import expected_stretch
from vptools.sources import photo_bgr
from vptools.tolerances import AGE_US_ABS, assert_close

CHELSEA = photo_bgr("chelsea.png")  # 451x300
# What rqt_console asks for: late joiners get the node's earlier records.
ROSOUT_QOS = QoSProfile(reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                        history=HistoryPolicy.KEEP_LAST, depth=1000)


README_TYPES = {"int": ParameterType.PARAMETER_INTEGER, "double": ParameterType.PARAMETER_DOUBLE,
                "string": ParameterType.PARAMETER_STRING, "bool": ParameterType.PARAMETER_BOOL,
                "int[]": ParameterType.PARAMETER_INTEGER_ARRAY, "double[]": ParameterType.PARAMETER_DOUBLE_ARRAY,
                "string[]": ParameterType.PARAMETER_STRING_ARRAY}


def readme_rows() -> dict[str, list[str]]:
    """The README's parameter table: name -> [type, default, meaning]."""
    section = (ROOT / "README.md").read_text().split("### Parameters", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([a-z_.]+)` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split(" | ")]
    return rows


def set_params(peer: Peer, node: str, params: list[Parameter]) -> list:
    return call(peer, SetParameters, f"{node}/set_parameters", SetParameters.Request(parameters=params)).results


def get_param(peer: Peer, node: str, name: str):
    return call(peer, GetParameters, f"{node}/get_parameters", GetParameters.Request(names=[name])).values[0]


def start_clock(peer: Peer, seconds: float):
    """A /clock publisher that publishes `seconds` every 50 ms while the peer spins;
    returns a function that moves the clock."""
    pub = peer.node.create_publisher(Clock, "/clock", RELIABLE)
    now = {"t": seconds}

    def tick() -> None:
        msg = Clock()
        msg.clock.sec, msg.clock.nanosec = int(now["t"]), int(round((now["t"] % 1) * 1e9))
        pub.publish(msg)

    peer.node.create_timer(0.05, tick)
    peer.spin_until(lambda: pub.get_subscription_count() >= 1, 10, "the node's /clock subscription")

    def move(t: float) -> None:
        now["t"] = t

    return move


def age_on_clock(peer: Peer, clock_s: float) -> tuple[int, float]:
    """Send frames stamped 0.25 s (plus k ns) before `clock_s` until one is processed after
    the node's clock reached `clock_s` (its age is not 0); return (stamp, age_us)."""
    deadline = time.monotonic() + 15
    k = 0
    while time.monotonic() < deadline:
        stamp = int(round((clock_s - 0.25) * 1e9)) + k
        peer.send_until_received(image_msg(CHELSEA, "bgr8", stamp, "cam"))
        age = peer.timing_for(stamp).age_us
        if age != 0.0:
            return stamp, age
        k += 1
    raise AssertionError("no frame was processed on the node's /clock time")


def test_rosout_parameter_events_descriptors_and_refusals(tmp_path: Path) -> None:
    ns, node_name = "/cz", "/cz/vision_preproc"
    args = ["-r", f"__ns:={ns}", "-p", "backend:=cpu", "-p", "network_image_width:=64", "-p",
            "network_image_height:=48", "-p", "resize_mode:=stretch", "--log-level", "debug"]
    with NodeProcess(args, log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        logs: list[Log] = []
        events: list[ParameterEvent] = []
        peer.node.create_subscription(Log, "/rosout", logs.append, ROSOUT_QOS)
        peer.node.create_subscription(ParameterEvent, "/parameter_events", events.append, RELIABLE)
        try:
            peer.wait_connected()
            peer.spin_until(lambda: ("vision_preproc", ns) in peer.node.get_node_names_and_namespaces(), 10,
                            "the node in the graph")
            pubs: dict = {}
            peer.spin_until(lambda: pubs.update(peer.node.get_publisher_names_and_types_by_node("vision_preproc", ns))
                            or {"/rosout", "/parameter_events"} <= set(pubs), 10, "/rosout and /parameter_events")
            assert pubs["/rosout"] == ["rcl_interfaces/msg/Log"], pubs
            assert pubs["/parameter_events"] == ["rcl_interfaces/msg/ParameterEvent"], pubs

            # Start-up records, received late thanks to rosout's transient local QoS.
            peer.spin_until(lambda: any(r.msg.startswith("backend cpu") for r in logs), 10, "the start-up log record")
            rec = next(r for r in logs if r.msg.startswith("backend cpu"))
            assert (rec.name, rec.level) == ("cz.vision_preproc", Log.INFO), rec
            assert rec.file.endswith("mod.rs") and rec.line > 0, rec
            assert abs(rec.stamp.sec - time.time()) < 120, rec.stamp
            # --log-level debug: the node's DEBUG records reach /rosout too.
            assert any(r.level == Log.DEBUG and r.msg == "parameter network_image_width = 64" for r in logs), \
                [r.msg for r in logs if r.level == Log.DEBUG][:5]
            assert all(r.name == "cz.vision_preproc" for r in logs if r.msg.startswith("parameter ")), logs

            # Descriptors: ranges, steps, read_only, constraints.
            names = ["network_image_width", "conv.size", "pad_value", "backend", "input_qos_depth", "use_sim_time",
                     "debug_image_rate"]
            d = {x.name: x for x in call(peer, DescribeParameters, f"{node_name}/describe_parameters",
                                         DescribeParameters.Request(names=names)).descriptors}
            r = d["network_image_width"].integer_range[0]
            assert (r.from_value, r.to_value, r.step, d["network_image_width"].type) == (1, 8192, 1, ParameterType.PARAMETER_INTEGER)
            r = d["conv.size"].integer_range[0]
            assert (r.from_value, r.to_value, r.step) == (1, 15, 2)
            r = d["pad_value"].floating_point_range[0]
            assert (r.from_value, r.to_value, d["pad_value"].type) == (0.0, 255.0, ParameterType.PARAMETER_DOUBLE_ARRAY)
            assert d["backend"].read_only and d["input_qos_depth"].read_only
            assert "one of: auto, cuda, cpu" in d["backend"].additional_constraints
            assert not d["use_sim_time"].read_only and d["use_sim_time"].type == ParameterType.PARAMETER_BOOL
            assert not d["debug_image_rate"].read_only and "0 disables" in d["debug_image_rate"].additional_constraints

            # The README's table states what the descriptors state (types, ranges, read-only).
            every = call(peer, ListParameters, f"{node_name}/list_parameters", ListParameters.Request()).result.names
            described = call(peer, DescribeParameters, f"{node_name}/describe_parameters",
                             DescribeParameters.Request(names=list(every))).descriptors
            rows = readme_rows()
            assert sorted(rows) == sorted(every), (sorted(rows), sorted(every))
            for x in described:
                kind, _, meaning = rows[x.name]
                assert README_TYPES[kind] == x.type, (x.name, kind, x.type)
                assert ("read-only" in meaning) == x.read_only, (x.name, meaning)
                ranges = [f"[{r.from_value}, {r.to_value}]" + (f" with step {r.step}" if r.step > 1 else "")
                          for r in x.integer_range]
                ranges += [f"[{r.from_value:g}, {r.to_value:g}]" for r in x.floating_point_range]
                for text in ranges:
                    assert text in meaning, (x.name, text, meaning)

            # Refusals in ROS words; nothing changes.
            res = set_params(peer, node_name, [param("network_image_width", 0), param("backend", "cuda"),
                                               param("tensor_name", None), param("conv.size", 4),
                                               param("pixel_scale", "x")])
            assert [x.successful for x in res] == [False] * 5
            assert res[0].reason == "network_image_width must be in [1, 8192] (got 0)"
            assert res[1].reason.startswith("parameter 'backend' cannot be set because it is read-only")
            assert res[2].reason.startswith("parameter 'tensor_name' cannot be undeclared (deleted)")
            assert res[3].reason == "conv.size must be in [1, 15] with step 2 (got 4)"
            assert res[4].reason == "parameter pixel_scale is of type double; setting it to string is not allowed"
            assert not [e for e in events if e.changed_parameters], events

            # An integer for a double: stored, announced and logged as the double.
            res = set_params(peer, node_name, [param("debug_image_rate", 5)])
            assert res[0].successful, res[0].reason
            got = get_param(peer, node_name, "debug_image_rate")
            assert (got.type, got.double_value) == (ParameterType.PARAMETER_DOUBLE, 5.0)
            peer.spin_until(lambda: any(e.changed_parameters for e in events), 5, "a parameter event")
            ev = next(e for e in events if e.changed_parameters)
            assert ev.node == node_name and [p.name for p in ev.changed_parameters] == ["debug_image_rate"]
            assert (ev.changed_parameters[0].value.type, ev.changed_parameters[0].value.double_value) == \
                (ParameterType.PARAMETER_DOUBLE, 5.0)
            peer.spin_until(lambda: any(r.msg == "parameter debug_image_rate set to 5.0; applies from the next frame"
                                        for r in logs), 5, "the change on /rosout")

            # A rule between parameters, in one request in the "wrong" order (the kernel
            # before its weights): accepted; the identity kernel leaves the tensor as it was.
            identity = param("conv.weights", [0.0] * 4 + [1.0] + [0.0] * 4)
            res = set_params(peer, node_name, [param("conv.kernel", "custom"), identity])
            assert [x.successful for x in res] == [True, True], [x.reason for x in res]
            t = peer.send_until_received(image_msg(CHELSEA, "bgr8", 7_000_000_001, "cam"))
            assert_close(tensor_array(t), expected_stretch(CHELSEA, 64, 48, [0.5] * 3, [0.5] * 3), "float32",
                         "identity conv")

            # use_sim_time at run time: age_us follows /clock.
            res = set_params(peer, node_name, [param("use_sim_time", True)])
            assert res[0].successful, res[0].reason
            start_clock(peer, 2000.5)
            stamp, age = age_on_clock(peer, 2000.5)
            assert abs(age - (2000.5e9 - stamp) / 1e3) <= AGE_US_ABS, (age, stamp)
        finally:
            peer.close()
        assert node.stop() == 0, node.output()


def test_shared_parameters_file_with_sim_time(tmp_path: Path) -> None:
    ns = "/shared"
    params = tmp_path / "robot.yaml"
    params.write_text(
        "/**:\n  ros__parameters:\n    use_sim_time: true\n    robot_frame: base_link\n"
        "camera_driver:\n  ros__parameters:\n    exposure: 10\n"
        "vision_preproc:\n  ros__parameters:\n    backend: cpu\n    network_image_width: 64\n"
        "    network_image_height: 48\n    resize_mode: stretch\n    image_mean: [0.1, 0.2, 0.3]\n"
        "    conv.kernal: box\n    conv.border: reflect101\n")
    with NodeProcess(["-r", f"__ns:={ns}", "--params-file", str(params)], log=tmp_path / "node.log") as node:
        peer = Peer(ns)
        logs: list[Log] = []
        statuses: list = []
        peer.node.create_subscription(Log, "/rosout", logs.append, ROSOUT_QOS)
        peer.node.create_subscription(
            DiagnosticArray, "/diagnostics",
            lambda m: statuses.extend((m.header.stamp, s) for s in m.status if s.name == "shared/vision_preproc"),
            RELIABLE)
        try:
            peer.wait_connected()
            # Unknown keys: warned about (with the closest name), ignored; other nodes'
            # sections do not apply.
            peer.spin_until(lambda: sum(r.level == Log.WARN and "is not a parameter" in r.msg for r in logs) >= 2, 10,
                            "the warnings about unknown parameters")
            warned = sorted(r.msg for r in logs if r.level == Log.WARN and "is not a parameter" in r.msg)
            assert warned == [
                "parameter `conv.kernal` is not a parameter of vision_preproc (ignored); did you mean `conv.kernel`?",
                "parameter `robot_frame` is not a parameter of vision_preproc (ignored)",
            ], warned
            assert get_param(peer, f"{ns}/vision_preproc", "use_sim_time").bool_value is True
            # A dotted name written flat is the nested parameter (rcl's parser reads it so).
            assert get_param(peer, f"{ns}/vision_preproc", "conv.border").string_value == "reflect101"

            # Sim time and no /clock yet: frames are processed, stamps copied, age 0.
            t = peer.send_until_received(image_msg(CHELSEA, "bgr8", 3_000_000_001, "cam"))
            assert stamp_ns(t.header) == 3_000_000_001 and t.header.frame_id == "cam"
            assert_close(tensor_array(t), expected_stretch(CHELSEA, 64, 48, [0.1, 0.2, 0.3], [0.5] * 3), "float32",
                         "shared file")
            assert peer.timing_for(3_000_000_001).age_us == 0.0
            # ... and /diagnostics waits for the clock (one status per second of it).
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                peer.executor.spin_once(timeout_sec=0.05)
            assert statuses == [], statuses

            # /clock at a chosen time: age_us = clock - stamp.
            move = start_clock(peer, 1000.0)
            stamp, age = age_on_clock(peer, 1000.0)
            assert abs(age - (1000.0e9 - stamp) / 1e3) <= AGE_US_ABS, (age, stamp)
            # The clock moves 1.5 s: a /diagnostics status, stamped with the sim time.
            move(1001.5)
            peer.spin_until(lambda: bool(statuses), 5, "a /diagnostics status on the sim clock")
            stamp_s = statuses[0][0].sec + statuses[0][0].nanosec * 1e-9
            assert 1000.9 <= stamp_s <= 1001.5, stamp_s
        finally:
            peer.close()
        assert node.stop() == 0, node.output()
