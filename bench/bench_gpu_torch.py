#!/usr/bin/env python3
"""GPU benchmark: vision_preproc's CUDA backend against PyTorch doing the same work on the
same frames, in one run, on one GPU; plus start-up and memory at 1080p.

Runs ON the GPU machine (needs torch with CUDA, numpy, opencv; no Rust). Steps:

1. Frames: test/data/rocket.jpg scaled with cv2.INTER_LINEAR to each case's size, raw
   bytes written to <work>/case<i>.raw (rgb8 for cases 0 and 2, bgr8 for case 1).
2. Start-up (before anything else touches the GPU): `vision_preproc bench --startup`
   with a 1920x1080 rgb8 frame, cold (empty kernel cache, fresh each run) and warm
   (cache filled), each a separate process; process start -> first tensor is measured
   here from just before the spawn to the child's first output line (written after the
   first tensor); the GPU memory of the process is `nvidia-smi` memory.used while the
   child holds its memory minus memory.used before the spawn.
3. Repeats (default 5), each: `vision_preproc bench --frames <work>` (our figures on the
   same frames, including the GPU frame upload + fused + conv2d + download timed with
   CUDA events), then PyTorch on the same frames: eager, CUDA graph and torch.compile
   (default mode, inductor; cuda graphs off in that mode), each timed per iteration with
   CUDA events for the GPU frame (pinned host -> device, preprocess + conv2d, device ->
   pinned host) and for the device work alone. Inputs rotate over as many buffer sets as
   our benchmark uses (>= 4x L2), so neither side reads its frame from a warm L2.
4. Check: torch's tensor against the tensor vision_preproc wrote for the same frame.

PyTorch pipeline (what a user writes): x.permute(2,0,1)[channel order].unsqueeze(0)
.float() -> F.interpolate(size, bilinear, align_corners=False, antialias=False) ->
(x / 255 - mean) / std -> F.pad(letterbox, value = normalized pad) -> F.conv2d(depthwise,
groups=3, the same Gaussian weights as ours, padding=k//2, i.e. zero border) ->
contiguous NCHW float32.

    python3 bench/bench_gpu_torch.py --bin .device/gpubench/vision_preproc --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "test" / "data" / "rocket.jpg"

# The cases of `vision_preproc bench` (src/backend/cuda/bench.rs, size_cases).
CASES = [
    dict(name="1280x720 rgb8 -> 640x480 stretch", src=(1280, 720), enc="rgb8",
         net=(640, 480), mode="stretch"),
    dict(name="1920x1200 bgr8 -> 640x480 letterbox", src=(1920, 1200), enc="bgr8",
         net=(640, 480), mode="letterbox"),
    dict(name="3840x2160 rgb8 -> 1920x1080 stretch", src=(3840, 2160), enc="rgb8",
         net=(1920, 1080), mode="stretch"),
]
MEAN, STD, SCALE, PAD = 0.5, 0.5, 1.0 / 255.0, 0.0  # Config::default()


def log(*a):
    print(*a, flush=True)


def smi(query: str) -> list[str]:
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
        return [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
    except Exception as e:  # noqa: BLE001 - a missing reading is recorded, not fatal
        return [f"error: {e}"]


def gpu_state() -> dict:
    keys = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,memory.used"
    vals = smi(keys)
    return dict(zip(keys.split(","), vals)) | {"time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def stats(v: list[float]) -> dict:
    s = sorted(v)
    n = len(s)
    q = lambda p: s[min(n - 1, max(0, int(round(p * (n - 1)))))]  # noqa: E731
    return dict(n=n, mean=sum(s) / n, p10=q(0.10), p50=q(0.50), p90=q(0.90), p99=q(0.99),
                min=s[0], max=s[-1])


def make_frames(work: Path, photo: Path) -> list[np.ndarray]:
    import cv2
    bgr = cv2.imread(str(photo))
    if bgr is None:
        raise SystemExit(f"cannot read {photo}")
    frames = []
    for i, c in enumerate(CASES):
        f = cv2.resize(bgr, c["src"], interpolation=cv2.INTER_LINEAR)
        if c["enc"] == "rgb8":
            f = cv2.cvtColor(f, cv2.COLOR_BGR2RGB)
        f = np.ascontiguousarray(f)
        (work / f"case{i}.raw").write_bytes(f.tobytes())
        frames.append(f)
    return frames


# ---------------------------------------------------------------- start-up and memory
def startup(binary: Path, work: Path, cold: int, warm: int, size: str, hold_ms: int) -> dict:
    runs = []
    cache = work / "startup_cache"
    env = dict(os.environ)
    env.pop("VISION_PREPROC_KERNEL_CACHE", None)
    for kind, n in (("cold", cold), ("warm", warm)):
        for _ in range(n):
            if kind == "cold":
                shutil.rmtree(cache, ignore_errors=True)
            base = smi("memory.used")[0]
            t0 = time.perf_counter()
            p = subprocess.Popen([str(binary), "bench", "--startup", str(cache), "--startup-frame",
                                  size, "--hold-ms", str(hold_ms)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
            first = p.stdout.readline()
            t_first = (time.perf_counter() - t0) * 1e3
            js = p.stdout.readline()
            during = smi("memory.used")[0]
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                   "--format=csv,noheader,nounits"], capture_output=True,
                                  text=True).stdout.strip()
            try:
                rss_hold = int(next(l.split()[1] for l in Path(f"/proc/{p.pid}/status").read_text()
                                    .splitlines() if l.startswith("VmRSS:")))
            except Exception:  # noqa: BLE001
                rss_hold = None
            out, err = p.communicate(timeout=120)
            rec = dict(kind=kind, process_start_to_first_tensor_ms=t_first, line=first.strip(),
                       returncode=p.returncode, gpu_mem_used_before_mib=base,
                       gpu_mem_used_during_mib=during, compute_apps=apps, rss_kb_while_held=rss_hold,
                       stderr=err[-2000:])
            if js.startswith("startup-json: "):
                rec["inner"] = json.loads(js[len("startup-json: "):])
                # The line comes after 100 more frames: take their time off.
                rec["process_start_to_first_line_ms"] = t_first
                t_first -= rec["inner"].get("since_first_tensor_ms", 0.0)
                rec["process_start_to_first_tensor_ms"] = t_first
            try:
                rec["gpu_mem_delta_mib"] = float(during) - float(base)
            except ValueError:
                pass
            log(f"startup {kind}: {t_first:.0f} ms to first tensor; {first.strip()}; "
                f"GPU memory delta {rec.get('gpu_mem_delta_mib')} MiB; apps {apps!r}")
            runs.append(rec)
    return dict(frame=size, runs=runs)


# ---------------------------------------------------------------- torch
def torch_case(torch, F, c: dict, frame: np.ndarray, weights: list[float], k: int, iters: int,
               warmup: int, modes: list[str], compiled: dict, state: dict) -> dict:
    dev = torch.device("cuda")
    (sw, sh), (nw, nh) = c["src"], c["net"]
    if c["mode"] == "letterbox":
        s = min(nw / sw, nh / sh)
        cw, ch = min(nw, max(1, round(sw * s))), min(nh, max(1, round(sh * s)))
    else:
        cw, ch = nw, nh
    x0, y0 = (nw - cw) // 2, (nh - ch) // 2
    bgr = c["enc"] == "bgr8"  # output channel order: rgb
    pad_norm = (PAD * SCALE - MEAN) / STD
    w = torch.tensor(weights, dtype=torch.float32, device=dev).view(1, 1, k, k).repeat(3, 1, 1, 1)

    def pre(x):  # x: (H, W, 3) uint8 on the GPU
        t = x.permute(2, 0, 1)
        if bgr:  # flip, not t[[2, 1, 0]]: a list index is a host->device copy, which a
            t = t.flip(0)  # CUDA graph capture refuses
        t = t.unsqueeze(0).float()
        t = F.interpolate(t, size=(ch, cw), mode="bilinear", align_corners=False, antialias=False)
        t = (t * SCALE - MEAN) / STD
        if (cw, ch) != (nw, nh):
            t = F.pad(t, (x0, nw - cw - x0, y0, nh - ch - y0), value=pad_norm)
        if k > 0:
            t = F.conv2d(t, w, padding=k // 2, groups=3)
        return t.contiguous()

    frame_bytes = frame.nbytes
    out_bytes = 3 * nw * nh * 4
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = max(1, min(32, -(-4 * l2 // (frame_bytes + out_bytes))))
    host_in = torch.from_numpy(frame).pin_memory()
    host_out = torch.empty((1, 3, nh, nw), dtype=torch.float32).pin_memory()
    xs = [torch.empty_like(host_in, device=dev) for _ in range(sets)]
    for x in xs:
        x.copy_(host_in)
    torch.cuda.synchronize()
    res = dict(sets=sets, content=[x0, y0, cw, ch])

    def timed(body, n):
        for i in range(warmup):
            body(i)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
        for i, (a, z) in enumerate(ev):
            a.record()
            body(warmup + i)
            z.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(z) * 1e3 for a, z in ev]

    for mode in modes:
        try:
            if mode == "eager":
                fn = pre
            elif mode == "compile":
                key = c["name"]
                if key not in compiled:
                    t0 = time.perf_counter()
                    compiled[key] = torch.compile(pre, dynamic=False)
                    compiled[key](xs[0])
                    torch.cuda.synchronize()
                    state.setdefault("compile_s", {})[key] = time.perf_counter() - t0
                fn = compiled[key]
            if mode in ("eager", "compile"):
                def frame_body(i, fn=fn):
                    x = xs[i % sets]
                    x.copy_(host_in, non_blocking=True)
                    host_out.copy_(fn(x), non_blocking=True)

                def dev_body(i, fn=fn):
                    fn(xs[i % sets])
                out = fn(xs[0])
            else:  # CUDA graph of the device work, one per buffer set; the two copies
                # are issued around the replay.
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        pre(xs[0])
                torch.cuda.current_stream().wait_stream(side)
                gd, outs = [], []
                for i in range(sets):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        y = pre(xs[i])
                    gd.append(g)
                    outs.append(y)

                def frame_body(i):
                    xs[i % sets].copy_(host_in, non_blocking=True)
                    gd[i % sets].replay()
                    host_out.copy_(outs[i % sets], non_blocking=True)

                def dev_body(i):
                    gd[i % sets].replay()
                gd[0].replay()
                out = outs[0]
            torch.cuda.synchronize()
            res[mode] = dict(frame=stats(timed(frame_body, iters)),
                             device_only=stats(timed(dev_body, iters)))
            res[mode]["output"] = out.detach().float().cpu().numpy().reshape(-1)
        except Exception as e:  # noqa: BLE001 - one failing mode must not lose the others
            res[mode] = dict(error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-3000:])
            log(f"torch {mode} {c['name']}: FAILED {e}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / ".device" / "gpubench" / "vision_preproc"))
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpubench_out"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--conv", type=int, default=5, help="Gaussian conv2d size (0: none)")
    ap.add_argument("--cases", default="0,1,2")
    ap.add_argument("--modes", default="eager,graph,compile")
    ap.add_argument("--startup-cold", type=int, default=3)
    ap.add_argument("--startup-warm", type=int, default=5)
    ap.add_argument("--startup-frame", default="1920x1080")
    ap.add_argument("--hold-ms", type=int, default=1500)
    ap.add_argument("--commit", default="")
    ap.add_argument("--photo", default=str(PHOTO))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpubench_"))
    binary = Path(a.bin).resolve()
    cases = [int(v) for v in a.cases.split(",") if v != ""]
    modes = [m for m in a.modes.split(",") if m]
    result = dict(
        date_utc=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        commit=a.commit, host=platform.node(), cpu_count=os.cpu_count(),
        python=sys.version.split()[0], gpu_before=gpu_state(),
        settings=vars(a), cases=[CASES[i] | {"index": i} for i in cases],
    )
    path = out / "gpu_h200.json"

    def save():
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")

    frames = make_frames(work, Path(a.photo))
    if a.startup_cold + a.startup_warm > 0:
        result["startup"] = startup(binary, work, a.startup_cold, a.startup_warm,
                                    a.startup_frame, a.hold_ms)
        save()

    import torch
    import torch.nn.functional as F
    result["torch"] = dict(version=torch.__version__, cuda=torch.version.cuda,
                           device=torch.cuda.get_device_name(0))
    env = dict(os.environ, VISION_PREPROC_KERNEL_CACHE=str(work / "bench_cache"))
    result["ours"], result["torch_runs"], result["clocks"] = [], [], []
    compiled, state = {}, {}
    checks = {}
    for r in range(a.repeats):
        result["clocks"].append(gpu_state())
        cmd = [str(binary), "bench", "--frames", str(work), "--cases", a.cases, "--conv-sizes", "0",
               "--frame-conv", str(a.conv), "--iterations", str(a.iterations), "--warmup",
               str(a.warmup), "--out", str(work / f"ours_{r}.json")]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        log(f"repeat {r}: ours rc {p.returncode} in {time.perf_counter() - t0:.1f} s")
        if p.returncode != 0:
            log(p.stdout[-3000:], p.stderr[-3000:])
            result["ours_error"] = p.stderr[-3000:]
            save()
            return 1
        if r == 0:
            (out / "ours_table.txt").write_text(p.stdout)
        ours = json.loads((work / f"ours_{r}.json").read_text())
        result["ours"].append(ours)
        ledgers = ours["ledgers"]
        runs = {}
        for j, ci in enumerate(cases):
            c = CASES[ci]
            wts = ledgers[j]["conv_weights"] or []
            t0 = time.perf_counter()
            res = torch_case(torch, F, c, frames[ci], wts, a.conv, a.iterations, a.warmup, modes,
                             compiled, state)
            mine = np.frombuffer((work / f"case{ci}.tensor").read_bytes(), dtype="<f4")
            for m in modes:
                o = res.get(m, {}).pop("output", None)
                if o is not None and r == 0:
                    d = np.abs(o.astype(np.float64) - mine)
                    nw, nh = c["net"]
                    rows = d.reshape(3, nh, nw).max(axis=(0, 2))
                    checks.setdefault(c["name"], {})[m] = dict(
                        max_abs_diff=float(d.max()), mean_abs_diff=float(d.mean()),
                        p999_abs_diff=float(np.quantile(d, 0.999)),
                        worst_row=int(rows.argmax()), n=int(d.size),
                        value_range=[float(mine.min()), float(mine.max())])
                fr = res.get(m, {}).get("frame")
                if fr:
                    log(f"  torch {m:8s} {c['name']}: frame p50 {fr['p50']:.1f} us, device-only "
                        f"p50 {res[m]['device_only']['p50']:.1f} us")
            runs[c["name"]] = res
            log(f"  torch {c['name']} in {time.perf_counter() - t0:.1f} s")
        result["torch_runs"].append(runs)
        result["check"] = checks
        result["torch_compile_s"] = state.get("compile_s", {})
        save()
    result["gpu_after"] = gpu_state()
    save()
    log(json.dumps(checks, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
