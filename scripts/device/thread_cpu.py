#!/usr/bin/env python3
"""Per-thread CPU time of running processes: where a process's time goes, by thread name,
without a profiler (Fast DDS names its threads: dds.shm.<port>, dds.udp.<port>, dds.ev.<id>,
...; the node names its own: process, publish, ...).

Usage: python3 scripts/device/thread_cpu.py SECONDS PID [PID ...]
Samples /proc/PID/task/*/stat at the start and the end of the window and prints, per
process, each thread's share of one core over the window (utime + stime), busiest first.
"""

from __future__ import annotations

import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def sample(pid: int) -> dict[int, tuple[str, int]]:
    out: dict[int, tuple[str, int]] = {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{base}/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1 : s.rindex(")")]
        fields = s[s.rindex(")") + 2 :].split()
        out[int(tid)] = (name, int(fields[11]) + int(fields[12]))
    return out


def main() -> None:
    seconds = float(sys.argv[1])
    pids = [int(p) for p in sys.argv[2:]]
    before = {p: sample(p) for p in pids}
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {p: sample(p) for p in pids}
    wall = time.monotonic() - t0
    for p in pids:
        try:
            with open(f"/proc/{p}/comm") as f:
                comm = f.read().strip()
        except OSError:
            comm = "?"
        rows = []
        for tid, (name, ticks) in after[p].items():
            start = before[p].get(tid, (name, 0))[1]
            rows.append((100.0 * (ticks - start) / TICK / wall, name, tid))
        rows.sort(reverse=True)
        total = sum(r[0] for r in rows)
        busy = ", ".join(f"{n} {c:.0f}%" for c, n, _ in rows if c >= 1.0)
        print(f"threads pid {p} ({comm}), {wall:.1f} s: total {total:.0f}% of a core; {busy}")


if __name__ == "__main__":
    main()
