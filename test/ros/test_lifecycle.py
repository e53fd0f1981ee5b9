"""The managed node (`vision_preproc_lifecycle_node`, docs/NODE.md "The managed node")
through real DDS, driven from rclpy as an independent peer with the lifecycle_msgs
services, as `ros2 lifecycle` and launch_ros' LifecycleNode drive it:

- its state machine answers exactly as an rclpy LifecycleNode's (rcl_lifecycle's) does:
  the same states, transition graph and available transitions, in the same order;
- the full cycle configure -> activate -> deactivate -> activate -> deactivate -> cleanup
  -> configure -> activate -> shutdown: frames flow only while active, every frame taken
  is published or counted, the transition events come in order, refused transitions are
  answered success: false;
- after cleanup: no tensor_ref socket, no pool memory, no threads beyond the unconfigured
  node's, resident memory back within a few MB of unconfigured (from /proc); cycle after
  cycle, the heap after cleanup does not grow;
- a configure that fails (backend cuda without a GPU; a `gst:` pipeline naming a missing
  element) leaves the node unconfigured and alive with the reason in the log and in
  /diagnostics; read-only parameters are set while unconfigured, and the next configure
  runs the fixed pipeline, which cleanup stops (no GStreamer threads left);
- a failure while active (`gpu_failure_policy: exit`, the fault injected by the test
  hooks' build) goes through ErrorProcessing as rclcpp_lifecycle's does: the node is
  unconfigured again, alive, the reason in its log and /diagnostics; configure retries."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from lifecycle_msgs.msg import State, Transition, TransitionEvent
from lifecycle_msgs.srv import ChangeState, GetAvailableStates, GetAvailableTransitions, GetState
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.lifecycle import LifecycleNode
from vptools.procs import INJECT_FAULT_ENV, LIFECYCLE_NODE_BIN, rss_mb
from vptools.rosharness import RELIABLE, NodeProcess, Peer, call, frame_counts, image_msg, param, status_values
from vptools.sources import photo_bgr

CHELSEA = photo_bgr("chelsea.png")
NODE_ARGS = ["-p", "backend:=cpu", "-p", "network_image_width:=64", "-p", "network_image_height:=48"]
#: Resident memory the node may hold after cleanup above what it held unconfigured, without
#: the pages of its DDS participant's shared-memory segments (RssShmem: the participant
#: lives in every state; frames touched 2-3 MB of it): code pages run for the first time,
#: rayon's pool (the CPU backend's, process-wide) and allocator caches. Measured on the
#: 2-core machine: heap (RssAnon) +1.4 to +4.1 MB, code (RssFile) +1.2 MB. What configure
#: opens is checked by name besides (socket, memfds, threads); on the GPU machine the CUDA
#: context alone is hundreds of MB (docs/NODE.md).
RSS_AFTER_CLEANUP_MB = 8.0
#: The heap's part of it (RssAnon).
HEAP_AFTER_CLEANUP_MB = 6.0
#: Over HEAP_CYCLES configure -> activate -> frame -> deactivate -> cleanup cycles after
#: WARM_CYCLES (code run the first time, Fast DDS pools at their working size), the heap
#: (RssAnon) after cleanup may grow by HEAP_GROWTH_MB: what configure makes, cleanup frees.
#: Measured on the 2-core machine: +0.00 to +0.32 MB; with cleanup's publishers left on the
#: node (a fault injected for the check, the camera publishing after each cleanup) +1.45 MB.
HEAP_CYCLES, WARM_CYCLES, HEAP_GROWTH_MB = 10, 2, 1.0
#: glibc's allocator as a measuring instrument for that test: one arena (by default each
#: new thread may get one of up to 8 per core, and the heap grows for ~10 cycles as the
#: threads each configure starts fill them), no trimming and no mmap below 32 MB (freed
#: memory stays in the heap and is reused): RssAnon is the heap's high-water mark, flat
#: unless something is kept cycle after cycle.
STEADY_HEAP_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
                   "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
#: How long frames are sent to an inactive node (none may come out).
QUIET_S = 0.6


def transition(peer: Driver, node: str, tid: int) -> bool:
    req = ChangeState.Request(transition=Transition(id=tid))
    return peer.call(ChangeState, f"{node}/change_state", req, timeout=30, attempts=1).success


def state(peer: Driver, node: str) -> str:
    return peer.call(GetState, f"{node}/get_state", GetState.Request()).current_state.label


def graph(peer: Driver, node: str, which: str) -> list[tuple]:
    r = peer.call(GetAvailableTransitions, f"{node}/{which}", GetAvailableTransitions.Request())
    return [(t.transition.id, t.transition.label, t.start_state.id, t.start_state.label, t.goal_state.id,
             t.goal_state.label) for t in r.available_transitions]


def states(peer: Driver, node: str) -> list[tuple]:
    r = peer.call(GetAvailableStates, f"{node}/get_available_states", GetAvailableStates.Request())
    return [(s.id, s.label) for s in r.available_states]


def threads(pid: int) -> list[str]:
    """The names of the process's threads (one that ends while they are read is left out)."""
    names = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(Path(f"/proc/{pid}/task/{t}/comm").read_text().strip())
        except FileNotFoundError:
            pass
    return sorted(names)


def threads_added(pid: int, before: list[str]) -> list[str]:
    """The threads the process has now that it had not in `before` (names, as a multiset),
    without rayon's global pool: the CPU backend's workers (`cpu-worker-N`, process-wide, at
    most one per CPU; the node starts them with itself, so they are normally in `before`)."""
    added = list((Counter(threads(pid)) - Counter(before)).elements())
    workers = [t for t in added if t.startswith("cpu-worker-")]
    assert len(workers) <= (os.cpu_count() or 1), added
    return [t for t in added if not t.startswith("cpu-worker-")]


def stacks(pid: int) -> str:
    """Each thread's name and innermost functions (gdb), to say what an unexpected thread
    is: one the libraries start unnamed carries the process's name."""
    try:
        out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 8"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no stacks: {e})"
    return "\n".join(line[:160] for line in out.splitlines() if line.startswith(("Thread ", "#")))


def wait_no_thread_added(peer: Driver, pid: int, before: list[str]) -> None:
    """Until the process has no thread beyond `before` and the CPU workers (10 s): a
    pipeline's streaming threads go back to GLib's shared pool, the node stops the idle
    ones, and one returned a moment later leaves within GLib's idle time (the node lowers
    it to 1 s); a thread just started carries its parent's name until it names itself
    (the idle node's `spin` thread, started again as a transition ends: most likely the
    third "CPU worker" of a CI run when the workers were unnamed and counted). On failure,
    the stacks of all threads."""
    left: list[str] = []

    def none_left() -> bool:
        left[:] = threads_added(pid, before)
        return not left
    try:
        peer.spin_until(none_left, 10, "no thread beyond the idle node's")
    except AssertionError as e:
        raise AssertionError(f"{e}: {left}\n{stacks(pid)}") from None


def memfds(pid: int) -> int:
    """The process's open memfd files (the tensor_ref pool's blocks are memfds)."""
    return sum("memfd:" in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
               if os.path.exists(f"/proc/{pid}/fd/{fd}"))


class Driver(Peer):
    """The peer: images in, tensors, transition events and the node's /diagnostics out."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.clients: dict[str, object] = {}

    def call(self, srv_type, name: str, request, **kw):
        """rosharness.call with one client per service, made at its first call: a client
        made per call stays in the peer, and the node's participant keeps what it
        discovered of each (~0.1 MB of the node's heap a cycle of four transitions,
        docs/NODE.md), which the heap measured here is not to count."""
        if name not in self.clients:
            self.clients[name] = self.node.create_client(srv_type, name)
        return call(self, srv_type, name, request, client=self.clients[name], **kw)

    def watch(self, node: str) -> None:
        self.events: list[TransitionEvent] = []
        # (stamp in ns, status): the stamp tells a status published before a transition
        # answered from one after it, whatever order DDS and the executor deliver them in.
        self.status: list[tuple[int, DiagnosticStatus]] = []
        self.node.create_subscription(TransitionEvent, f"{node}/transition_event", self.events.append, RELIABLE)
        name = node.strip("/")
        self.node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: self.status.extend(
            (m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec, s) for s in m.status if s.name == name),
            RELIABLE)

    def fresh_status(self, timeout: float = 5.0) -> DiagnosticStatus:
        """The first status stamped from now on (the node's clock is the system's here)."""
        since = time.time_ns()
        fresh = lambda: [s for stamp, s in self.status if stamp >= since]  # noqa: E731
        self.spin_until(lambda: bool(fresh()), timeout, "a /diagnostics status")
        return fresh()[0]

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.02)

    def stream(self, seconds: float, first_stamp: int) -> int:
        """Publish a frame every 20 ms for `seconds`; returns the next stamp."""
        stamp, end = first_stamp, time.monotonic() + seconds
        while time.monotonic() < end:
            self.pub.publish(image_msg(CHELSEA, "bgr8", stamp, "cam"))
            stamp += 1_000_000
            self.executor.spin_once(timeout_sec=0.02)
        return stamp


def test_the_state_machine_is_rcl_lifecycles(tmp_path: Path, run_dir: Path) -> None:
    """States, transition graph and the transitions available in each primary state,
    against an rclpy LifecycleNode served by the peer; the full cycle with frames only
    while active; resources after cleanup; shutdown exits 0."""
    ns, node = "/lc_cycle", "/lc_cycle/vision_preproc"
    env = {"XDG_RUNTIME_DIR": str(run_dir)}
    proc = NodeProcess(["-r", f"__ns:={ns}", *NODE_ARGS], binary=LIFECYCLE_NODE_BIN, env=env,
                       log=tmp_path / "node.log").start()
    peer = Driver(ns)
    reference = LifecycleNode("reference", namespace="/lc_ref", context=peer.context)
    peer.executor.add_node(reference)
    try:
        peer.watch(node)
        pid = proc.proc.pid
        assert state(peer, node) == "unconfigured"
        assert states(peer, node) == states(peer, "/lc_ref/reference")
        assert graph(peer, node, "get_transition_graph") == graph(peer, "/lc_ref/reference", "get_transition_graph")
        assert graph(peer, node, "get_available_transitions") == graph(
            peer, "/lc_ref/reference", "get_available_transitions")
        # Refused: activate from unconfigured (the node stays, and says why in its log).
        assert not transition(peer, node, Transition.TRANSITION_ACTIVATE)
        assert state(peer, node) == "unconfigured"
        status = peer.fresh_status()
        assert (status.level, status.message) == (DiagnosticStatus.OK, "unconfigured"), status
        threads_idle, rss_idle = threads(pid), rss_mb(pid)

        stamp = cycle(peer, node, pid, run_dir, 1_000_000_000)
        # After cleanup: nothing that configure opened.
        assert transition(peer, node, Transition.TRANSITION_CLEANUP)
        assert state(peer, node) == "unconfigured"
        assert not list(run_dir.glob("vision_preproc/*.sock")) and memfds(pid) == 0
        wait_no_thread_added(peer, pid, threads_idle)
        # The camera goes on publishing (r2r 0.9 releases a dropped subscription, its
        # reader's history included, when its next message arrives: docs/NODE.md).
        stamp = peer.stream(0.3, stamp)
        peer.spin_for(0.3)
        rss = rss_mb(pid)
        own = rss["VmRSS"] - rss["RssShmem"] - (rss_idle["VmRSS"] - rss_idle["RssShmem"])
        assert own < RSS_AFTER_CLEANUP_MB, (rss, rss_idle)
        assert rss["RssAnon"] - rss_idle["RssAnon"] < HEAP_AFTER_CLEANUP_MB, (rss, rss_idle)
        # Configured again, active, then shut down from active: the process exits 0.
        assert transition(peer, node, Transition.TRANSITION_CONFIGURE)
        assert transition(peer, node, Transition.TRANSITION_ACTIVATE)
        peer.send_until_received(image_msg(CHELSEA, "bgr8", stamp, "cam"))
        assert transition(peer, node, Transition.TRANSITION_ACTIVE_SHUTDOWN)
        assert proc.proc.wait(timeout=10) == 0, proc.output()
        P = State  # noqa: N806 (a short name for the table)
        want = [(P.PRIMARY_STATE_UNCONFIGURED, P.TRANSITION_STATE_CONFIGURING),
                (P.TRANSITION_STATE_CONFIGURING, P.PRIMARY_STATE_INACTIVE),
                *[(P.PRIMARY_STATE_INACTIVE, P.TRANSITION_STATE_ACTIVATING),
                  (P.TRANSITION_STATE_ACTIVATING, P.PRIMARY_STATE_ACTIVE),
                  (P.PRIMARY_STATE_ACTIVE, P.TRANSITION_STATE_DEACTIVATING),
                  (P.TRANSITION_STATE_DEACTIVATING, P.PRIMARY_STATE_INACTIVE)] * 2,
                (P.PRIMARY_STATE_INACTIVE, P.TRANSITION_STATE_CLEANINGUP),
                (P.TRANSITION_STATE_CLEANINGUP, P.PRIMARY_STATE_UNCONFIGURED),
                (P.PRIMARY_STATE_UNCONFIGURED, P.TRANSITION_STATE_CONFIGURING),
                (P.TRANSITION_STATE_CONFIGURING, P.PRIMARY_STATE_INACTIVE),
                (P.PRIMARY_STATE_INACTIVE, P.TRANSITION_STATE_ACTIVATING),
                (P.TRANSITION_STATE_ACTIVATING, P.PRIMARY_STATE_ACTIVE),
                (P.PRIMARY_STATE_ACTIVE, P.TRANSITION_STATE_SHUTTINGDOWN),
                (P.TRANSITION_STATE_SHUTTINGDOWN, P.PRIMARY_STATE_FINALIZED)]
        peer.spin_until(lambda: len(peer.events) >= len(want), 5, "the last transition events")
        assert [(e.start_state.id, e.goal_state.id) for e in peer.events] == want
    finally:
        peer.close()
        proc.stop()
    log = proc.output()
    assert "Unable to start transition 3 from current state unconfigured" in log, log


def cycle(peer: Driver, node: str, pid: int, run_dir: Path, stamp: int) -> int:
    """configure -> activate -> deactivate -> activate -> deactivate: tensors only while
    active, every frame taken published or counted; the pool's socket and memory exist
    while configured. Returns the next stamp."""
    assert transition(peer, node, Transition.TRANSITION_CONFIGURE)
    assert state(peer, node) == "inactive"
    peer.wait_connected()
    assert list(run_dir.glob("vision_preproc/*.sock")) and memfds(pid) > 0
    stamp = peer.stream(QUIET_S, stamp)
    assert peer.tensors == []
    status = peer.fresh_status()
    assert (status.level, status.message) == (DiagnosticStatus.OK, "inactive"), status
    assert frame_counts(status)["Frames received"] == 0, status_values(status)
    for _ in range(2):
        assert transition(peer, node, Transition.TRANSITION_ACTIVATE)
        peer.send_until_received(image_msg(CHELSEA, "bgr8", stamp, "cam"))
        stamp = peer.stream(QUIET_S, stamp + 1_000_000)
        assert transition(peer, node, Transition.TRANSITION_DEACTIVATE)
        peer.spin_for(0.2)  # the tensors published before the answer arrive
        published = len(peer.tensors)
        stamp = peer.stream(QUIET_S, stamp)
        assert len(peer.tensors) == published, "tensors while inactive"
        counts = frame_counts(peer.fresh_status())
        taken = sum(counts[k] for k in ("Frames published", "Frames dropped (queue)",
                                         "Frames rejected (invalid)", "Frames failed (error)"))
        assert counts["Frames received"] == taken and counts["Frames published"] >= 1, counts
    # Not allowed from inactive: deactivate (id 4).
    assert not transition(peer, node, Transition.TRANSITION_DEACTIVATE)
    return stamp


def test_cycles_give_the_heap_back(tmp_path: Path, run_dir: Path) -> None:
    """configure -> activate -> a frame -> deactivate -> cleanup, again and again: the heap
    after cleanup stays where the first cycles left it. (The image subscription each cleanup
    drops is destroyed by r2r 0.9 at its next message, the next cycle's first frame: one
    lingers at each measurement, docs/NODE.md.)"""
    ns, node = "/lc_heap", "/lc_heap/vision_preproc"
    env = {"XDG_RUNTIME_DIR": str(run_dir), **STEADY_HEAP_ENV}
    proc = NodeProcess(["-r", f"__ns:={ns}", *NODE_ARGS], binary=LIFECYCLE_NODE_BIN, env=env,
                       log=tmp_path / "node.log").start()
    peer = Driver(ns)
    heap: list[float] = []
    try:
        for stamp in range(1_000_000_000, 1_000_000_000 + WARM_CYCLES + HEAP_CYCLES):
            assert transition(peer, node, Transition.TRANSITION_CONFIGURE)
            assert transition(peer, node, Transition.TRANSITION_ACTIVATE)
            peer.wait_connected()
            peer.send_until_received(image_msg(CHELSEA, "bgr8", stamp, "cam"))
            assert transition(peer, node, Transition.TRANSITION_DEACTIVATE)
            assert transition(peer, node, Transition.TRANSITION_CLEANUP)
            heap.append(rss_mb(proc.proc.pid)["RssAnon"])
        growth = heap[-1] - heap[WARM_CYCLES - 1]
        assert growth < HEAP_GROWTH_MB, f"{growth:.2f} MB over {HEAP_CYCLES} cycles: {heap}"
    finally:
        peer.close()
        assert proc.stop() == 0, proc.output()


def test_a_configure_that_fails_leaves_the_node_unconfigured(tmp_path: Path) -> None:
    """backend cuda without a GPU, then a pipeline naming a missing element: configure
    answers false, the node stays unconfigured and alive, the reason in the log and in
    /diagnostics (ERROR). Read-only parameters are set while unconfigured; the fixed
    pipeline configures and runs; cleanup stops its threads."""
    ns, node = "/lc_fail", "/lc_fail/vision_preproc"
    bad = "gst:videotestsrc ! nosuchelement"
    good = "gst:videotestsrc is-live=true ! video/x-raw,format=GRAY8,width=64,height=48,framerate=30/1"
    args = ["-r", f"__ns:={ns}", *NODE_ARGS, "-p", "backend:=cuda", "-p", f'inputs:=["{bad}"]']
    proc = NodeProcess(args, binary=LIFECYCLE_NODE_BIN, log=tmp_path / "node.log").start()
    peer = Driver(ns, publish_images=False)
    try:
        peer.watch(node)
        pid = proc.proc.pid
        assert state(peer, node) == "unconfigured"
        threads_idle = threads(pid)
        inputs = Parameter(name="inputs", value=ParameterValue(type=ParameterType.PARAMETER_STRING_ARRAY,
                                                              string_array_value=[good]))
        for fix, words in ((param("backend", "cpu"), ["cuda"]), (inputs, ["nosuchelement"])):
            assert not transition(peer, node, Transition.TRANSITION_CONFIGURE)
            assert state(peer, node) == "unconfigured" and proc.proc.poll() is None
            status = peer.fresh_status()
            assert status.level == DiagnosticStatus.ERROR and "configure failed" in status.message, status
            assert all(w in status.message for w in words), status.message
            failed = [line for line in proc.output().splitlines() if "configure failed" in line]
            assert failed and all(w in failed[-1] for w in words), proc.output()
            r = call(peer, SetParameters, f"{node}/set_parameters", SetParameters.Request(parameters=[fix]))
            assert r.results[0].successful, r.results[0].reason
        # Set while unconfigured: they apply at the next configure (and the log says so).
        assert 'parameter backend set to "cpu"; applies at the next configure' in proc.output(), proc.output()
        wait_no_thread_added(peer, pid, threads_idle)
        assert transition(peer, node, Transition.TRANSITION_CONFIGURE)
        assert peer.fresh_status().level == DiagnosticStatus.OK
        assert transition(peer, node, Transition.TRANSITION_ACTIVATE)
        peer.spin_until(lambda: len(peer.tensors) >= 3, 15, "tensors from the pipeline")
        assert transition(peer, node, Transition.TRANSITION_DEACTIVATE)
        assert transition(peer, node, Transition.TRANSITION_CLEANUP)
        wait_no_thread_added(peer, pid, threads_idle)
        # Read-only again once configured: refused while inactive.
        assert transition(peer, node, Transition.TRANSITION_CONFIGURE)
        r = call(peer, SetParameters, f"{node}/set_parameters",
                 SetParameters.Request(parameters=[param("backend", "auto")]))
        assert not r.results[0].successful and "read-only" in r.results[0].reason
    finally:
        peer.close()
        assert proc.stop() == 0, proc.output()


def test_a_failure_while_active_goes_through_error_processing(tmp_path: Path) -> None:
    """gpu_failure_policy exit and the second frame's backend call failing (the test hooks'
    simulated CUDA fault on the CPU backend): the node deactivates itself with an error,
    ErrorProcessing frees everything and the node is unconfigured, alive, the reason in its
    log and /diagnostics (ERROR); configure and activate again publish."""
    ns, node = "/lc_err", "/lc_err/vision_preproc"
    args = ["-r", f"__ns:={ns}", *NODE_ARGS, "-p", "gpu_failure_policy:=exit"]
    proc = NodeProcess(args, binary=LIFECYCLE_NODE_BIN, env={INJECT_FAULT_ENV: "2"}, log=tmp_path / "node.log").start()
    peer = Driver(ns)
    try:
        peer.watch(node)
        assert transition(peer, node, Transition.TRANSITION_CONFIGURE)
        assert transition(peer, node, Transition.TRANSITION_ACTIVATE)
        peer.wait_connected()
        stamp = 1_000_000_000
        peer.send_until_received(image_msg(CHELSEA, "bgr8", stamp, "cam"))
        # Frames until the second one processed fails and the node has been through
        # ErrorProcessing (its last event: errorprocessing -> unconfigured).
        end = time.monotonic() + 10
        while not any(e.goal_state.id == State.PRIMARY_STATE_UNCONFIGURED for e in peer.events):
            assert time.monotonic() < end, f"no ErrorProcessing: {[e.goal_state.label for e in peer.events]}"
            stamp += 1_000_000
            peer.pub.publish(image_msg(CHELSEA, "bgr8", stamp, "cam"))
            peer.spin_for(0.05)
        P = State  # noqa: N806 (a short name for the table)
        assert [(e.start_state.id, e.goal_state.id) for e in peer.events] == [
            (P.PRIMARY_STATE_UNCONFIGURED, P.TRANSITION_STATE_CONFIGURING),
            (P.TRANSITION_STATE_CONFIGURING, P.PRIMARY_STATE_INACTIVE),
            (P.PRIMARY_STATE_INACTIVE, P.TRANSITION_STATE_ACTIVATING),
            (P.TRANSITION_STATE_ACTIVATING, P.PRIMARY_STATE_ACTIVE),
            (P.PRIMARY_STATE_ACTIVE, P.TRANSITION_STATE_DEACTIVATING),
            (P.TRANSITION_STATE_DEACTIVATING, P.TRANSITION_STATE_ERRORPROCESSING),
            (P.TRANSITION_STATE_ERRORPROCESSING, P.PRIMARY_STATE_UNCONFIGURED)]
        assert state(peer, node) == "unconfigured" and proc.proc.poll() is None
        status = peer.fresh_status()
        assert status.level == DiagnosticStatus.ERROR, status
        assert status.message.startswith("unconfigured: error while active: GPU failure, gpu_failure_policy exit: "
                                         "CUDA: injected Sticky fault"), status.message
        assert status_values(status)["Lifecycle state"] == "unconfigured", status_values(status)
        # Configure retries; the fault plan counts the new backend's frames (the first is good).
        assert transition(peer, node, Transition.TRANSITION_CONFIGURE)
        assert transition(peer, node, Transition.TRANSITION_ACTIVATE)
        received = len(peer.tensors)
        peer.send_until_received(image_msg(CHELSEA, "bgr8", stamp + 1_000_000, "cam"))
        assert len(peer.tensors) > received
    finally:
        peer.close()
        assert proc.stop() == 0, proc.output()
    log = proc.output()
    assert re.search(r"GPU failure, gpu_failure_policy exit: CUDA: injected Sticky fault", log), log
    assert "Error occurred while doing error handling." in log, log


assert rclpy  # the peer's rclpy (imported for its side effects by vptools.rosharness)
