#!/usr/bin/env python3
"""Print the Markdown tables of docs/BENCHMARKS.md (CPU machine) from docs/evidence/*.json,
without running anything again. Usage: python3 bench/tables.py [--results docs/evidence]"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # bench_*.py are imported from this script's folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default=str(ROOT / "docs" / "evidence"))
    res = Path(ap.parse_args().results)
    if (res / "cpu.json").exists():
        from bench_cpu import report
        d = json.loads((res / "cpu.json").read_text())
        print("## cpu.json\n\n" + "\n".join(report(d["meta"], d["runs"])) + "\n")
    from bench_node import table as node_table
    for f in [res / "node.json", res / "node_rust_player.json", *sorted(res.glob("shm_*mb.json")),
              res / "malloc_mmap_threshold.json"]:
        if f.exists():
            d = json.loads(f.read_text())
            loads = [r["load_before"][0] for r in d["results"]] + [r["load_after"][0] for r in d["results"]]
            m = d["meta"]
            print(f"## {f.name}\n\n_{m['date']}, commit {m['commit']}, {m['cpus']} CPUs, {m['transport']}, "
                  f"publisher {m.get('publisher')}, {m.get('runs')} run(s) x {m.get('seconds')} s, "
                  f"load avg {min(loads):.1f}-{max(loads):.1f}_\n")
            print("\n".join(node_table(d["results"])) + "\n")
            seen = set()
            for r in d["results"]:  # the rclpy publisher's own timing, first run of each case
                key = (r["node"], r["size"], r["rate"])
                if "rclpy publish" in r.get("publisher_out", "") and key not in seen:
                    seen.add(key)
                    print(f"- publisher, {' '.join(key)}: {r['publisher_out']}")
            print()
    if (res / "startup.json").exists():
        from bench_startup import table as startup_table
        d = json.loads((res / "startup.json").read_text())
        m = d["meta"]
        loads = [r["load"][0] for r in d["results"]]
        print(f"## startup.json\n\n_{m['date']}, commit {m['commit']}, {m['cpus']} CPUs, {m['source']}, "
              f"cold = {m['eviction']}, load avg {min(loads):.1f}-{max(loads):.1f}_\n")
        print("\n".join(startup_table(d["results"])) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
