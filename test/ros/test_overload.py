"""Overload for 60 s, which is also CI's 60-second soak (issue 8), through real DDS.

One run covers both: the soak's input (1920x1080 bgr8 camera frames at 30 Hz, played from
Rust by `vision_preproc play --loop --restamp`) into a node configured so that 30 Hz is
more than 5x what it can process (1280x960 float16 output with a dense 15x15 conv2d on one
worker thread, RAYON_NUM_THREADS=1: ~110-150 ms per frame here, so the machine's second
core is left to the player and the peer). If the machine processes faster than 30/7 Hz,
vptools.soak (scripts/soak.py) raises the input rate to 7x the processing rate measured in the
warm-up (OVERLOAD_MARGIN), so the overload holds on faster machines too.

Asserted (definitions and reasons in python/vptools/soak.py):
- overload: the player sent >= 5x the node's processing rate (tensors published per s);
- frame accounting, exact, from /diagnostics after the player stopped: received =
  published + dropped + rejected + failed; published = tensors this reliable peer got;
  the node's final "stopped:" line agrees;
- memory: a plateau: the highest RSS of the last 20 s < 5 % above the highest before
  (short runs step up as glibc's heap and Fast DDS's pools reach their high-water marks);
- tensor age: every tensor's node-added latency (FrameTiming.total_us) <= the three frame
  periods around it (slot, processing, publishing thread); p99 <= 3 T (T = 1 / processing
  rate);
- soak: node-added latency p50/p99 of the first vs the last 15 s within the drift bounds;
  exit code 0 on SIGINT.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from vptools import soak
from vptools.soak import HEAVY  # a dense 15x15 conv2d (no separable fast path): slow processing


@pytest.mark.alone
def test_overload_5x_for_60_s_is_also_the_ci_soak(tmp_path: Path) -> None:
    cfg = soak.SoakConfig(seconds=60, rate=30, width=1920, height=1080, warmup=5, overload=True,
                          node_params=HEAVY, node_threads=1, window=15, ns="/overload")
    res = soak.run(cfg, tmp_path, log=print)
    report = soak.report(res)
    print(report)
    (tmp_path / "result.json").write_text(json.dumps(asdict(res), indent=1, default=str))
    assert not res.failures, report
    # The headline numbers, spelled out.
    c = res.counts
    assert res.measured_s >= 60, report
    assert res.sent / res.measured_s >= 5 * res.processing_rate_hz > 0, report
    assert c["received"] == c["published"] + c["dropped"] + c["rejected"] + c["failed"], report
    assert c["published"] == res.peer_tensors and c["dropped"] > 0, report
    assert res.rss_mb["growth"] < 0.05, report
    assert res.age["n_violations"] == 0 and res.age["p99_over_period"] <= 2.0, report
