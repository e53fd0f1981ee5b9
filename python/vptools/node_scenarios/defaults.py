"""The default set: the fault scenarios (healthy, fallback, retry, exit: a node with or
without an injected CUDA fault under each gpu_failure_policy), latency and start-up."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

from vptools.node_scenarios.common import CONFIG, KERNEL_CACHE, WORK, grep, lines_of, nl, scenario, text
from vptools.node_scenarios.run import Run
from vptools.procs import INJECT_FAULT_ENV


def fault_run(run: Run, sc: str, fault: str, policy: str) -> None:
    """The small network on the demo bag (as recorded, looped 4 s) with a recorder of
    tensors and /diagnostics; `fault`: the node with the test hooks and that injection.
    The node's exit status must be 0 (1 for `exit`); the bag goes to $OUT."""
    log = run.out / f"{sc}.log"
    rec_dir = WORK / f"rec_{sc}"
    shutil.rmtree(rec_dir, ignore_errors=True)
    head = (f"==== {sc}: {f'{INJECT_FAULT_ENV}={fault}' if fault else 'no fault'}, gpu_failure_policy {policy} "
            f"({time.strftime('%H:%M:%S', time.gmtime())} UTC, commit {run.commit})")
    rec = run.spawn([run.cli, "record", rec_dir, "--duration", 9, "--diagnostics"], WORK / f"rec_{sc}.log")
    time.sleep(1)
    node = run.node([*run.small(), "-p", f"gpu_failure_policy:={policy}"], WORK / f"node_{sc}.log",
                    binary=run.node_fi if fault else run.node_bin,
                    env={INJECT_FAULT_ENV: fault} if fault else None)
    run.wait(run.player(run.demo_bag, sc, "--loop", "--duration", 4, "--wait-subscribers", 1))
    run.wait(rec)
    rc = run.stop_node(node)
    body = [head, *lines_of(WORK / f"node_{sc}.log", WORK / f"play_{sc}.log", WORK / f"rec_{sc}.log"),
            f"node exit code {rc}"]
    log.write_text(nl(body) + "\n")
    for line in body:
        print(line[:400])
    expected = 1 if sc == "exit" else 0
    if rc != expected:
        run.fail(f"UNEXPECTED exit code {rc} (expected {expected})")
    if sc != "exit":
        subprocess.run(["tar", "cf", str(run.out / f"{sc}_bag.tar"), "-C", str(WORK), f"rec_{sc}"], check=False)


@scenario
def healthy(run: Run) -> None:
    """The small network (64x48 + 5x5 gaussian conv2d) on the demo bag, no fault: the node
    must exit 0; its tensors recorded ($OUT/healthy_bag.tar)."""
    fault_run(run, "healthy", "", "retry")


@scenario
def fallback(run: Run) -> None:
    """As healthy, the node with the test hooks: VISION_PREPROC_INJECT_CUDA_FAULT=40 (sticky:
    illegal address), gpu_failure_policy fallback; the node must exit 0."""
    fault_run(run, "fallback", "40", "fallback")


@scenario
def retry(run: Run) -> None:
    """As healthy, the node with the test hooks: VISION_PREPROC_INJECT_CUDA_FAULT=40:transient
    (out of memory), gpu_failure_policy retry; the node must exit 0."""
    fault_run(run, "retry", "40:transient", "retry")


@scenario
def exit(run: Run) -> None:  # noqa: A001 (the scenario's name)
    """As healthy, the node with the test hooks: VISION_PREPROC_INJECT_CUDA_FAULT=40 (sticky),
    gpu_failure_policy exit; the node must exit 1."""
    fault_run(run, "exit", "40", "exit")


@scenario
def latency(run: Run) -> None:
    """config/default.yaml, 1280x720 and 1920x1080 bgr8 at 30 Hz restamped (LATENCY_SIZES):
    end-to-end and node-added latency, fps, drops, RSS and GPU memory (3 x 10 s each, TRIALS)."""
    with run.tee("latency"):
        for size in run.k.latency_sizes:
            for i in run.k.n(3):
                tag = f"lat_{size}_{i}"
                rec_dir = WORK / f"rec_{tag}"
                shutil.rmtree(rec_dir, ignore_errors=True)
                node = run.node(["--params-file", CONFIG, "-p", f"backend:={run.k.backend}"], WORK / f"node_{tag}.log")
                rec = run.spawn([run.cli, "record", rec_dir, "--duration", 13, "--json", run.out / f"{tag}.json"],
                                WORK / f"rec_{tag}.log")
                play = run.player(run.bags / f"bgr8_{size}", tag, "--loop", "--restamp", "--duration", 10,
                                  "--wait-subscribers", 1)
                time.sleep(6)
                mem = run.mem(node)
                run.wait(play, rec)
                run.stop_node(node)
                print(f"{size} trial {i}: {nl(lines_of(WORK / f'play_{tag}.log')[:1])}; "
                      f"{nl(grep('^latency', WORK / f'rec_{tag}.log'))}; node {mem}; "
                      f"{nl(grep('stopped:.*', WORK / f'node_{tag}.log', only=True))}")
                shutil.rmtree(rec_dir, ignore_errors=True)


@scenario
def startup(run: Run) -> None:
    """Process start -> first 1080p tensor received, with an empty kernel cache, then cached (3 x, TRIALS)."""
    with run.tee("startup"):
        for i in run.k.n(3):
            shutil.rmtree(KERNEL_CACHE, ignore_errors=True)
            for label in (f"cold{i}", f"warm{i}"):
                tag = f"start_{label}"
                rec_dir, js = WORK / f"rec_{tag}", WORK / f"{tag}.json"
                shutil.rmtree(rec_dir, ignore_errors=True)
                rec = run.spawn([run.cli, "record", rec_dir, "--duration", 12, "--json", js], None)
                play = run.spawn([run.cli, "play", run.bags / "bgr8_1920x1080", "--loop", "--duration", 12], None)
                time.sleep(2)
                t0 = time.time_ns()
                node = run.node(["--params-file", CONFIG, "-p", f"backend:={run.k.backend}"], WORK / f"node_{tag}.log")
                time.sleep(8)
                mem = run.mem(node)
                run.stop_node(node)
                run.wait(play, rec)
                try:
                    first = json.loads(text(js)).get("first_tensor_ns")
                except ValueError:
                    first = None
                ms = (first - t0) / 1e6 if first else float("nan")
                print(f"startup {label}: process start -> first 1080p tensor received {ms:.0f} ms; node {mem}")
                shutil.rmtree(rec_dir, ignore_errors=True)
