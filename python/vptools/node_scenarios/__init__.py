"""The ROS node on the GPU machine: its scenarios, one function each
(scripts/device/gpu_node_remote.py is the command line).

Here first: scripts/device/gpu_node_stage.sh (the node, the CLI and their ROS 2 libraries
-> .device/ros.tar.xz; the GStreamer the node links -> .device/gst.tar.xz; input bags ->
.device/node_bags.tar.xz; the demo bag -> .device/bag; for `cudaref`,
scripts/device/py312_bundle.sh -> .device/py312.tar.xz). Then there (CUDA, no ROS), from
the repository root, carrying .device:

    PYTHONPATH=python python3 scripts/device/gpu_node_remote.py [scenario ...]
    (default: healthy fallback retry exit latency startup; --list: every scenario)

The driver runs on the machine's python3 with the standard library alone; the consumers
that need rclpy run on the same python3 with the py312 bundle's environment. Real DDS
(Fast DDS, loopback, ROS_DOMAIN_ID 21 unless set) between processes: `vision_preproc
play` (camera), the node, `vision_preproc record` (subscriber; prints /diagnostics changes
and latency). Each scenario's function says what it runs.

Knobs (environment): OUT (the results folder, /tmp/vp_out), TRIALS (the trials of each
repeated measurement; default the scenario's own, 2 or 3), LATENCY_SIZES ("1280x720
1920x1080"), HANDOFF_BACKEND, HANDOFF_SPIN_MS, CUDAREF_MODES, CUDAREF_SLOW_S,
CUDAREF_BATCH_ARGS, CUDAREF_BATCH_PLAY, PLAYERS (3), PROFILE_SIDES, SWEEP_RATES,
SWEEP_SIDES, SWEEP_BACKEND (their meanings: the functions that read them). A value
outside its set is refused before anything runs.

Without a GPU (a dry run here): `--backend cpu` (or BACKEND=cpu) gives every node the CPU backend
(HANDOFF_BACKEND and SWEEP_BACKEND default to it); `--bin DIR` runs the binaries in DIR
(target/release, or an unpacked bundle's bin/) with the ROS 2 of the calling shell
(`source .ros/env.sh`) instead of unpacking ros.tar.xz; `--stage DIR` reads the staged
files from DIR instead of .device.

Outputs: $OUT/<scenario>.log; the recorded bags of healthy, fallback, retry (and of
handoff's and cudaref's byte checks) as $OUT/<name>_bag.tar (compare with an offline CPU
replay here: scripts/device/compare_bags.py); JSON per run. Exit status 1 when a check
failed, 2 when the command line is refused.
"""

# The package: common.py (where things are, the plan and its knobs, the log readers, the
# table of scenarios), run.py (Run: one invocation, its processes and failures), then one
# module per family of scenarios (FAMILIES below); this module is the command line.

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vptools import ROOT
# In this order: each family adds its scenarios to the table as it is imported.
from vptools.node_scenarios import defaults, handoff, cameras, throughput  # isort: skip
from vptools.node_scenarios.common import (DEFAULT_SCENARIOS, JPEG_BAG, SCENARIOS, Knobs, Refused,
                                           gst_source, knobs_from, plan, played, sent)
from vptools.node_scenarios.handoff import PEERS, compare_hashes, fnv1a64
from vptools.node_scenarios.run import Run
from vptools.node_scenarios.throughput import sweep_summary

#: The modules of the scenarios' families, imported in the order of the scenario table (each
#: adds its own with @scenario; docs/TESTING.md lists them in this order): the default set,
#: tensor_ref, cameras and compressed inputs, rates and batching. common and run are shared.
FAMILIES = (defaults, handoff, cameras, throughput)
__all__ = ["DEFAULT_SCENARIOS", "JPEG_BAG", "SCENARIOS", "Knobs", "Refused", "Run", "compare_hashes", "fnv1a64",
           "gst_source", "knobs_from", "listing", "main", "plan", "played", "sent", "sweep_summary"]


def listing(full: bool = False) -> str:
    """Each scenario and what it runs (its docstring; the first 160 characters unless `full`)."""
    out = []
    for name, fn in SCENARIOS.items():
        doc = (fn.__doc__ or "").strip()
        if full:
            out.append(f"{name}\n    {doc}\n")
        else:
            doc = " ".join(doc.split())
            out.append(f"  {name:<11} {doc[:160] + ('...' if len(doc) > 160 else '')}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_node_remote.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="scenarios:\n" + listing())
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="default: " + " ".join(DEFAULT_SCENARIOS))
    ap.add_argument("--list", action="store_true", help="print the scenarios and exit")
    ap.add_argument("--stage", type=Path, default=ROOT / ".device", help="the staged files (default .device)")
    ap.add_argument("--bin", type=Path, help="run the binaries in BIN with this shell's ROS 2, not the bundle's")
    ap.add_argument("--backend", default=os.environ.get("BACKEND", "cuda"),
                    help="every node's backend: cuda (default) or cpu")
    ap.add_argument("--peer", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.peer:
        if a.peer[0] not in PEERS:
            ap.error(f"unknown peer {a.peer[0]}")
        return PEERS[a.peer[0]](*a.peer[1:])
    if a.list:
        print(listing(full=True))
        return 0
    try:
        names, knobs = plan(a.scenarios, os.environ, a.backend)
    except Refused as e:
        print(f"gpu_node_remote: {e}", file=sys.stderr)
        return 2
    if a.bin is not None and not (a.bin / "vision_preproc_node").exists():
        print(f"gpu_node_remote: --bin {a.bin}: no vision_preproc_node there", file=sys.stderr)
        return 2
    sys.stdout.reconfigure(line_buffering=True)
    run = Run(knobs, Path(os.environ.get("OUT", "/tmp/vp_out")), a.stage, a.bin)
    run.prepare()
    run.nvidia_smi("name,driver_version,clocks.sm,clocks.max.sm,clocks.mem")
    for name in names:
        try:
            SCENARIOS[name](run)
        except SystemExit:
            raise
        except Exception as e:  # one scenario's breakage is reported; the others still run
            run.fail(f"{name}: {type(e).__name__}: {e}")
        finally:
            run.reap()
    run.nvidia_smi("clocks.sm,clocks.mem")
    if run.failures:
        print(f"gpu_node_remote: {len(run.failures)} check(s) failed:\n  "
              + "\n  ".join(f.strip() for f in run.failures))
    return 1 if run.failures else 0
