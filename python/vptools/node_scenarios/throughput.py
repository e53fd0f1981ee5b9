"""Rates and batching: `single` and `single_own` (one camera, the highest sustained rate),
`profile` (per-thread CPU), `batch`, `batchfault` and `batchmax` (4 cameras batched in one
node against separate nodes)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from vptools.node_scenarios.common import (CONFIG, INPUTS2, INPUTS4, PREV_DIR, SHM, WORK, grep, nl, played,
                                           scenario, sent, tag_logs, text)
from vptools.node_scenarios.run import Run
from vptools.procs import INJECT_FAULT_ENV, NodeProcess


def start_side(run: Run, side: str, letter: str, tag: str,
               mode: str) -> tuple[list[NodeProcess], list[subprocess.Popen]]:
    """One node with 4 inputs (namespace /<letter>b; batched_own: input_participants
    per_input), two with 2 inputs each (pairs, /<letter>p0..1) or 4 single-camera nodes
    (separate, /<letter>s0..3), 640x640 letterbox, and a `record` per tensor topic (a bag
    in /dev/shm for mode `bag`, else --count-only)."""
    net = ["-p", f"backend:={run.k.sweep_backend}", "-p", "network_image_width:=640",
           "-p", "network_image_height:=640"]
    nodes, recs = [], []

    def record(name: str, ns: str, json_path: Path, *batch: str) -> None:
        out = [SHM / f"rec_{name}"] if mode == "bag" else ["--count-only"]
        recs.append(run.spawn([run.cli, "record", *out, *batch, "--tensor-topic", f"{ns}/tensor",
                               "--timing-topic", f"{ns}/timing", "--duration", 60, "--json", json_path],
                              WORK / f"rec_{name}.log"))

    if side in ("batched", "batched_own"):
        own = ["-p", "input_participants:=per_input"] if side == "batched_own" else []
        nodes.append(run.node(["-r", f"__ns:=/{letter}b", "--params-file", CONFIG, *net, *own, "-p", INPUTS4],
                              WORK / f"node_{tag}.log"))
        record(tag, f"/{letter}b", run.out / f"{tag}.json", "--batch")
    elif side == "pairs":
        for k in range(2):
            nodes.append(run.node(["-r", f"__ns:=/{letter}p{k}", "--params-file", CONFIG, *net, "-p", INPUTS2],
                                  WORK / f"node_{tag}_{k}.log"))
            record(f"{tag}_{k}", f"/{letter}p{k}", run.out / f"{tag}_{k}.json", "--batch")
    else:
        for k in range(4):
            nodes.append(run.node(["-r", f"__ns:=/{letter}s{k}", "--params-file", CONFIG, *net],
                                  WORK / f"node_{tag}_{k}.log"))
            record(f"{tag}_{k}", f"/{letter}s{k}", run.out / f"{tag}_{k}.json")
    return nodes, recs


def single_30(run: Run, rel: str, bins: Path, trial: int) -> None:
    """One player at 30 Hz for 10 s into one single-camera node: node-added latency."""
    tag, ns = f"single30_{rel}_{trial}", f"/t{trial}{rel}"
    node = run.node(["-r", f"__ns:={ns}", "--params-file", CONFIG, "-p", f"backend:={run.k.backend}",
                     "-p", "network_image_width:=640", "-p", "network_image_height:=640"],
                    WORK / f"node_{tag}.log", binary=bins / "vision_preproc_node")
    rec = run.spawn([run.cli, "record", "--count-only", "--tensor-topic", f"{ns}/tensor", "--timing-topic",
                     f"{ns}/timing", "--duration", 60], WORK / f"rec_{tag}.log")
    run.wait(run.player(run.bags / "bgr8_1920x1080", tag, "--loop", "--restamp", "--duration", 10,
                        "--image-topic", f"{ns}/image", "--camera-info-topic", f"{ns}/camera_info",
                        "--wait-subscribers", 1, limit=60))
    time.sleep(1)
    run.term(node)
    run.stop_or_kill("node", node)
    run.term(rec)
    run.stop_or_kill("subscriber", rec)
    print(f"single {rel} trial {trial} (30 Hz): {nl(played(WORK / f'play_{tag}.log'))}; "
          f"{nl(grep('stopped:.*', WORK / f'node_{tag}.log', only=True))}")
    for line in grep("node-added", WORK / f"rec_{tag}.log"):
        print(f"  {rel} {line}")


def sweep_summary(side: str, rate: str, plays: list[Path], nodes: list[Path], recs: list[Path]) -> str:
    """One line of `batchmax`: frames sent / received / published / dropped per side and
    rate, published frames/s over the 6 s, the subscribers' tensors/s and node-added p50/p99."""
    sent_n = sum(int(m) for f in plays for m in re.findall(r"play: (\d+) images", text(f)))
    tot = {"received": 0, "published": 0, "dropped": 0, "rejected": 0, "failed": 0}
    for f in nodes:
        m = re.search(r"stopped: (\d+) frames received, (\d+) published, (\d+) dropped.*?(\d+) rejected.*?(\d+) failed",
                      text(f))
        for k, v in zip(tot, m.groups() if m else [0] * 5):
            tot[k] += int(v)
    rx = re.compile(r"node-added p50 ([\d.na]+) ms, p99 ([\d.na]+) ms; ([\d.]+) tensors/s", re.I)
    lat = [rx.search(text(f)) for f in recs]
    added = " ".join(f"{m.group(1)}/{m.group(2)}" if m else "?" for m in lat)
    tps = sum(float(m.group(3)) for m in lat if m)
    hz = "max" if rate == "max" else f"{30 * float(rate):g} Hz"
    return (f"sweep {side} {hz}: sent {sent_n}, received {tot['received']}, published {tot['published']}, "
            f"dropped {tot['dropped']}, rejected {tot['rejected']}, failed {tot['failed']}; "
            f"published {tot['published'] / 6:.0f} frames/s; subscribers {tps:.1f} tensors/s; "
            f"node-added p50/p99 ms {added}")


@scenario
def single(run: Run) -> None:
    """One single-camera node, 1920x1080 bgr8 -> 640x640 float32 (config/default.yaml), the
    previous release (.device/prev.tar.xz) against this one, interleaved, 2 trials each
    (TRIALS): the highest sustained rate (PLAYERS=3 `play --max` on the node's one topic,
    6 s: published frames/s, received / dropped, each thread's CPU) and the node-added
    latency at 30 Hz (one player, 10 s, `record` p50 / p99)."""
    with run.tee("single"):
        run.warm_up()
        if not run.unpack_prev():
            return
        new = run.node_bin.parent
        print(f"prev: commit {text(PREV_DIR / 'COMMIT').strip()}; new: commit {run.commit}")
        for i in run.k.n(2):
            run.single_max("prev", PREV_DIR / "bin", i)
            run.single_max("new", new, i)
        for i in run.k.n(2):
            single_30(run, "prev", PREV_DIR / "bin", i)
            single_30(run, "new", new, i)


@scenario
def single_own(run: Run) -> None:
    """The single-camera node's highest rate (as `single`, this release only) with
    input_participants one vs per_input, interleaved, 2 trials (TRIALS)."""
    with run.tee("single_own"):
        run.warm_up()
        for i in run.k.n(2):
            run.single_max("one", run.node_bin.parent, i)
            run.single_max("own", run.node_bin.parent, i, "-p", "input_participants:=per_input")


@scenario
def profile(run: Run) -> None:
    """Where a node's time goes at --max, per thread (scripts/device/thread_cpu.py), for each
    side of PROFILE_SIDES (batched separate; also batched_own: the batched node with
    input_participants per_input; pairs: two nodes with 2 inputs each), with its players
    and subscribers."""
    with run.tee("profile"):
        run.warm_up()
        for side in run.k.profile_sides:
            tag = f"profile_{side}"
            nodes, recs = start_side(run, side, "p", tag, "count")
            plays = run.play_cameras(side, "p", tag, "--duration", 8, "--max")
            time.sleep(3)
            run.threads(3, side, *nodes, *plays, *recs)
            run.stop_side(plays, nodes, recs)
            stopped = grep(r"stopped: [0-9]* frames received, [0-9]* published, [0-9]* dropped",
                           *tag_logs("node", tag), only=True)
            print(f"profile {side}: sent {sent(*sorted(WORK.glob(f'play_{tag}_[0-9].log')))}; {' '.join(stopped)}")


@scenario
def batch(run: Run) -> None:
    """4 cameras 1920x1080 bgr8 at 30 Hz (4 players, phases not aligned) -> one node with 4
    inputs (TensorBatch 4x3x640x640) vs 4 single-camera nodes; node-added and end-to-end
    latency per side (2 x 10 s, interleaved, TRIALS)."""
    with run.tee("batch"):
        run.warm_up()
        for i in run.k.n(2):
            for side in ("batched", "separate"):
                tag = f"batch_{side}_{i}"
                nodes, recs = start_side(run, side, "b", tag, "bag")
                plays = run.play_cameras(side, "b", tag, "--duration", 10)
                time.sleep(6)
                mem = "".join(f" [{run.mem(n)}]" for n in nodes)
                run.wait(*plays)
                time.sleep(1)
                run.term(*recs)
                run.wait(*recs)
                run.term(*nodes)
                run.wait(*nodes)
                print(f"{side} trial {i}: {' '.join(played(*sorted(WORK.glob(f'play_{tag}_[0-9].log'))))} ")
                for line in grep("^latency", *tag_logs("rec", tag)):
                    print(f"  {side}: {line}")
                for line in grep("stopped:.*", *tag_logs("node", tag), only=True):
                    print(f"  {side} node {line}")
                print(f"  {side} nodes:{mem}")
                for d in SHM.glob(f"rec_{tag}*"):
                    shutil.rmtree(d, ignore_errors=True)


@scenario
def batchfault(run: Run) -> None:
    """A batched node (2 cameras 1080p at 60 Hz) with a real device fault at batch 40 (the
    node with the test hooks), gpu_failure_policy retry, then fallback: the policy acts
    while the publishing thread may hold the previous batch's buffer; the node must exit 0
    within 15 s of SIGTERM."""
    with run.tee("batchfault"):
        run.warm_up()
        for pol in ("retry", "fallback"):
            tag, log = f"bfault_{pol}", run.out / f"bfault_{pol}.log"
            node = run.node(["-r", "__ns:=/bf", "-p", f"backend:={run.k.sweep_backend}",
                             "-p", f"gpu_failure_policy:={pol}", "-p", "network_image_width:=640",
                             "-p", "network_image_height:=640", "-p", INPUTS2],
                            log, binary=run.node_fi, env={INJECT_FAULT_ENV: "40"})
            rec = run.spawn([run.cli, "record", "--count-only", "--batch", "--tensor-topic", "/bf/tensor",
                             "--timing-topic", "/bf/timing", "--duration", 60], WORK / f"rec_{tag}.log")
            plays = [run.player(run.bags / "bgr8_1920x1080", f"{tag}_{k}", "--loop", "--restamp", "--duration", 5,
                                "--rate", 2, "--image-topic", f"/bf/cam{k}/image", "--camera-info-topic",
                                f"/bf/cam{k}/camera_info", "--wait-subscribers", 1, limit=60) for k in range(2)]
            run.wait(*plays)
            time.sleep(1)
            run.term(rec)
            run.stop_or_kill("subscriber", rec)
            run.term(node)
            try:
                node.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                run.fail("  node did not exit: killed")
                node.proc.kill()
            rc = run.wait(node)[0]
            print(f"batch fault, policy {pol}: node exit code {rc}; "
                  f"{' '.join(played(*sorted(WORK.glob(f'play_{tag}_[0-9].log'))))} ")
            for line in grep(r"GPU failure|gpu_failure_policy|still being published|stopped:|panicked", log):
                print(f"  {line[:300]}")
            for line in grep("^record:", WORK / f"rec_{tag}.log"):
                print(f"  {line}")
            if rc != 0:
                run.fail(f"  batch fault, policy {pol}: node exit code {rc} (expected 0)")


@scenario
def batchmax(run: Run) -> None:
    """The sides of `batch` (SWEEP_SIDES) with the cameras at 30, 60, 120, 180, 240 Hz and
    as fast as they can (play --max), 6 s each (SWEEP_RATES="1 2": fewer rates, multiples of
    30 Hz): frames sent / received / published / dropped per side and rate (the highest rate
    without drops), and published frames/s at --max (the highest sustained rate); `record
    --count-only` as the subscribers. SWEEP_BACKEND=cpu: a dry run without a GPU."""
    with run.tee("batchmax"):
        run.warm_up()
        for rate in run.k.sweep_rates:
            for side in run.k.sweep_sides:
                tag = f"sweep_{side}_{rate}"
                pace = ["--max"] if rate == "max" else ["--rate", rate]
                nodes, recs = start_side(run, side, "w", tag, "count")
                plays = run.play_cameras(side, "w", tag, "--duration", 6, *pace)
                run.stop_side(plays, nodes, recs)
                play_logs = sorted(WORK.glob(f"play_{tag}_[0-9].log"))
                node_logs, rec_logs = tag_logs("node", tag), tag_logs("rec", tag)
                for f in (*node_logs, *rec_logs, *play_logs):
                    shutil.copy(f, run.out)
                print(sweep_summary(side, rate, play_logs, node_logs, rec_logs))
