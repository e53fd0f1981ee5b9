#!/usr/bin/env python3
"""Instructions per frame of the CPU backend on aarch64, counted under qemu-user.

Speed cannot be measured under emulation, but the number of guest instructions executed
can: qemu logs every translated block (`-d in_asm`: its instructions) and every execution
of one (`-d exec,nochain`: chaining off, so each execution is logged). This runs
`vision_preproc bench-cpu --threads 1 --warmup 1` twice, with FEW and MANY timed frames,
and reports (count(MANY) - count(FEW)) / (MANY - FEW): the instructions of one frame,
start-up and the synthetic frames excluded. With `--top` it also splits them by function
(the binary's symbols).

Usage: aarch64_insn_count.py CLI [--qemu "qemu-aarch64 -L ..."] [--few 1 --many 3]
       [--top 8] -- BENCH-CPU ARGUMENTS (e.g. --cpu-simd baseline --set ...)
"""

import argparse
import bisect
import collections
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading

BLOCK = re.compile(r"^0x([0-9a-f]+):")
EXEC = re.compile(r"^Trace \d+: 0x[0-9a-f]+ \[[0-9a-f]+/([0-9a-f]+)/")


def count(qemu, cli, bench_args, frames):
    """Guest instructions executed by one bench-cpu run, and per translated-block address."""
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "log")
        os.mkfifo(fifo)
        sizes = {}           # block address -> instructions (the last translation wins)
        execs = collections.Counter()
        current = [None]

        def reader():
            with open(fifo, errors="replace") as f:
                for line in f:
                    m = EXEC.match(line)
                    if m:
                        execs[int(m.group(1), 16)] += 1
                        continue
                    m = BLOCK.match(line)
                    if m:
                        a = int(m.group(1), 16)
                        if current[0] is None:
                            current[0] = a
                            sizes[a] = 0
                        sizes[current[0]] += 1
                    elif line.startswith("IN:") or not line.strip():
                        current[0] = None

        t = threading.Thread(target=reader)
        t.start()
        cmd = qemu + ["-d", "in_asm,exec,nochain", "-D", fifo, cli, "bench-cpu", "--threads", "1",
                      "--warmup", "1", "--frames", str(frames)] + bench_args
        r = subprocess.run(cmd, capture_output=True, text=True)
        t.join()
        if r.returncode != 0:
            sys.exit(f"{shlex.join(cmd)} exited {r.returncode}: {r.stderr}")
        per_block = {a: n * sizes.get(a, 0) for a, n in execs.items()}
        missing = [a for a in execs if a not in sizes]
        if missing:
            sys.exit(f"{len(missing)} executed blocks were never logged as translated")
        return sum(per_block.values()), per_block, r.stdout


def symbols(cli, load_base):
    """(sorted start addresses, names) of the binary's functions at its load address."""
    out = subprocess.run([os.environ.get("NM", "aarch64-linux-gnu-nm"), "-C", "--defined-only", cli],
                         capture_output=True, text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tT":
            syms.append((int(parts[0], 16) + load_base, parts[2]))
    syms.sort()
    return [s[0] for s in syms], [s[1] for s in syms]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cli")
    ap.add_argument("--qemu", default="qemu-aarch64 -L /usr/aarch64-linux-gnu "
                    "-E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib")
    ap.add_argument("--few", type=int, default=1)
    ap.add_argument("--many", type=int, default=3)
    ap.add_argument("--top", type=int, default=0, help="split one frame by function")
    ap.add_argument("--load-base", type=lambda s: int(s, 0), default=0x5500000000,
                    help="where qemu-user loads the PIE binary (qemu -d page shows it)")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    bench = argv[cut + 1:]
    qemu = shlex.split(a.qemu)
    n1, b1, _ = count(qemu, a.cli, bench, a.few)
    n2, b2, out = count(qemu, a.cli, bench, a.many)
    per_frame = (n2 - n1) / (a.many - a.few)
    simd = re.findall(r"\b(Neon|Baseline|Avx2)\b", out)
    print(f"{per_frame:,.0f} instructions per frame ({simd[-1] if simd else '?'}; "
          f"{n1:,} with {a.few} frames, {n2:,} with {a.many}) bench-cpu {shlex.join(bench)}")
    if a.top:
        starts, names = symbols(a.cli, a.load_base)
        by_fn = collections.Counter()
        end = a.load_base + os.path.getsize(a.cli)
        for addr in set(b1) | set(b2):
            i = bisect.bisect_right(starts, addr) - 1
            name = names[i] if a.load_base <= addr < end and i >= 0 else "(shared libraries: libc's memcpy, ...)"
            by_fn[name] += (b2.get(addr, 0) - b1.get(addr, 0)) / (a.many - a.few)
        for name, n in by_fn.most_common(a.top):
            print(f"  {n:>14,.0f}  {name[:150]}")


if __name__ == "__main__":
    main()
