#!/usr/bin/env python3
"""Tables (Markdown) and plots (PNG) from bench/bench_gpu_torch.py's JSON.

    python3 bench/plot_gpu.py docs/evidence/gpu_h200.json \
        --startup docs/evidence/gpu_h200_run1.json docs/evidence/gpu_h200_run2.json \
        --img docs/img > tables.md

Figures: for each case and each side, the p50 of every repeat (5 runs x 300 iterations);
the tables give the median of those p50s and their min-max (the spread over repeats).
Orin Nano prediction: bytes of the Jetson path's ledger (no upload or download: the
kernels read and write mapped memory) at 75% of 68 GB/s (51 GB/s), and at the 31 GB/s
that kernels achieved in the Orin Nano measurement of docs/GPU.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ORIN_EFF_GBPS = 68.0 * 0.75
ORIN_MEASURED_GBPS = 31.0
MODES = ["eager", "graph", "compile"]


def med(v):
    return statistics.median(v)


def spread(v):
    return f"{min(v):.1f}-{max(v):.1f}"


def ours_fig(runs, case_prefix, figure):
    out = []
    for r in runs:
        for f in r["figures"]:
            if f["case"].startswith(case_prefix) and f["figure"] == figure:
                out.append(f)
    return out


def torch_table(d, ours, cases, figure, key, header, ratio_digits):
    """Print the table of `figure` (ours) against torch's `key` timings, per case and torch
    mode; returns {case: (our p50s, {mode: torch p50s})} for the plots."""
    print(header)
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for c in cases:
        o = [f["p50_us"] for f in ours_fig(ours, c, figure)]
        t = {m: [r[c][m][key]["p50"] for r in d["torch_runs"] if key in r[c].get(m, {})]
             for m in MODES}
        rows[c] = (o, t)
        cells = [f"{med(t[m]):.1f} ({spread(t[m])})" if t[m] else "failed" for m in MODES]
        ratios = [f"{med(t[m]) / med(o):.{ratio_digits}f}x" if t[m] else "-" for m in MODES]
        print(f"| {c} | **{med(o):.1f}** ({spread(o)}) | " + " | ".join(cells) + " | "
              + " | ".join(ratios) + " |")
    print("")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--startup", nargs="*", default=[])
    ap.add_argument("--img", default="")
    a = ap.parse_args()
    d = json.loads(Path(a.json).read_text())
    ours = d["ours"]
    roof = [r["copy_roof_gbps"] for r in ours]
    cases = [c["name"] for c in d["cases"]]
    dev = ours[0]["device"]
    p = print
    p(f"Machine: {dev['name']} ({dev['arch']}, {dev['multiprocessors']} SMs, L2 "
      f"{dev['l2_bytes'] >> 20} MiB), driver {d['gpu_before']['driver_version']}, torch "
      f"{d['torch']['version']} (CUDA {d['torch']['cuda']}); SM clock measured "
      f"{min(min(r['device']['sm_clock_measured_mhz']) for r in ours):.0f}-"
      f"{max(max(r['device']['sm_clock_measured_mhz']) for r in ours):.0f} MHz by our clock64 "
      f"probe (nvidia-smi during the runs: {sorted({c['clocks.sm'] for c in d['clocks'][1:]})} MHz "
      f"SM, {d['clocks'][0]['clocks.mem']} MHz memory); copy roof {min(roof):.0f}-{max(roof):.0f} "
      f"GB/s; date {d['date_utc']}; commit {d['commit'][:7]}; {len(ours)} repeats x "
      f"{d['settings']['iterations']} iterations (after {d['settings']['warmup']} warm-up) per "
      f"figure and side.\n")

    # --- GPU frame, then device work only: ours vs torch
    rows = torch_table(d, ours, cases, "GPU frame (upload + fused + conv2d + download)", "frame",
                       "| case | vision_preproc GPU frame p50 us | torch eager | torch CUDA graph | "
                       "torch.compile | eager / ours (goal >= 5x) | graph / ours (goal >= 2x) | "
                       "compile / ours |", 2)
    dev_rows = torch_table(d, ours, cases, "fused + conv2d (device only)", "device_only",
                           "| case | vision_preproc fused + conv2d (device only) p50 us | torch eager "
                           "| torch CUDA graph | torch.compile | eager / ours | graph / ours | "
                           "compile / ours |", 1)

    # --- ledger and roof
    p("| case | stage | bytes (MB) | p50 us (spread) | GB/s | % of dtod copy roof |")
    p("|---|---|---|---|---|---|")
    stages = ["upload (pinned WC -> device)", "fused (direct)", "conv2d 5x5 gaussian",
              "fused + conv2d (device only)", "download (device -> pinned)",
              "GPU frame (upload + fused + conv2d + download)",
              "full frame + conv2d, upload mode", "full frame + conv2d, mapped mode"]
    for c in cases:
        for s in stages:
            fs = ours_fig(ours, c, s)
            if not fs:
                continue
            v = [f["p50_us"] for f in fs]
            mb = fs[0]["ledger_bytes"] / 1e6
            gbps = fs[0]["ledger_bytes"] / (med(v) * 1e-6) / 1e9
            label = s + (" (wall clock, CPU copies included)" if "full frame" in s else "")
            p(f"| {c} | {label} | {mb:.2f} | {med(v):.1f} ({spread(v)}) | {gbps:.0f} | "
              f"{100 * gbps / med(roof):.1f} |")
    p("")

    # --- Orin prediction
    p("| case | Jetson path bytes: fused + conv2d (MB) | + CPU copies in/out (MB) | predicted "
      "Orin Nano kernels @51 GB/s (75% of 68) | @31 GB/s (measured Orin rate) | with CPU "
      "copies @51 / @31 GB/s |")
    p("|---|---|---|---|---|---|")
    for c, lg in zip(cases, ours[0]["ledgers"]):
        k, full = lg["jetson_mapped_frame_kernels"], lg["jetson_mapped_frame_with_cpu_copies"]
        p(f"| {c} | {k / 1e6:.2f} | {full / 1e6:.2f} | {k / ORIN_EFF_GBPS / 1e3:.0f} us | "
          f"{k / ORIN_MEASURED_GBPS / 1e3:.0f} us | {full / ORIN_EFF_GBPS / 1e3:.0f} / "
          f"{full / ORIN_MEASURED_GBPS / 1e3:.0f} us |")
    p("")

    # --- numeric check
    p("| case | torch mode | max abs diff vs vision_preproc | mean abs diff | values |")
    p("|---|---|---|---|---|")
    for c in cases:
        for m, ch in d.get("check", {}).get(c, {}).items():
            p(f"| {c} | {m} | {ch['max_abs_diff']:.2e} | {ch['mean_abs_diff']:.1e} | "
              f"{ch['value_range'][0]:.3f}..{ch['value_range'][1]:.3f} |")
    p("")

    # --- start-up
    st = []
    for f in a.startup:
        j = json.loads(Path(f).read_text())
        for i, r in enumerate(j.get("startup", {}).get("runs", [])):
            inner = r.get("inner", {})
            kind = r["kind"]
            if kind == "cold" and i == 0:
                kind = "cold, first process on a fresh machine"
            elif kind == "cold":
                kind = "cold (empty kernel cache)"
            else:
                kind = "warm (kernel cache)"
            st.append(dict(kind=kind, total=r["process_start_to_first_tensor_ms"],
                           ctx=inner.get("context_ms"), open=inner.get("open_ms"),
                           compile=max([k["compile_ms"] for k in inner.get("kernels", [])] or [0]),
                           frame=inner.get("first_frame_ms"), rss=inner.get("rss_kb"),
                           rss100=inner.get("rss_kb_after_100_frames"),
                           rss_held=r.get("rss_kb_while_held"), apps=r.get("compute_apps", ""),
                           mem=inner.get("device_used_bytes", {}), src=f))
    if st:
        p("| start | runs | process start -> first tensor ms, median (min-max) | CUDA context "
          "ms | backend open ms (NVRTC compile, longest file) | first 1920x1080 frame ms |")
        p("|---|---|---|---|---|---|")
        for kind in ["cold, first process on a fresh machine", "cold (empty kernel cache)",
                     "warm (kernel cache)"]:
            g = [s for s in st if s["kind"] == kind]
            if not g:
                continue
            col = lambda k: [s[k] for s in g]  # noqa: E731
            p(f"| {kind} | {len(g)} | **{med(col('total')):.0f}** ({min(col('total')):.0f}-"
              f"{max(col('total')):.0f}) | {med(col('ctx')):.0f} ({min(col('ctx')):.0f}-"
              f"{max(col('ctx')):.0f}) | {med(col('open')):.0f} ({med(col('compile')):.0f}) | "
              f"{med(col('frame')):.1f} |")
        p("")
        w = [s for s in st if s["kind"].startswith("warm")]
        m = w[-1]["mem"]
        held = [s for s in w if s["mem"].get("after_100_frames") and s["src"] == a.startup[-1]]
        p(f"Memory (warm runs): VmRSS in the process at the first tensor "
          f"{med([s['rss'] for s in w]) / 1e3:.1f} MB; after 100 more frames "
          f"{med([s['rss100'] for s in w if s['rss100']] or [0]) / 1e3:.1f} MB"
          + (f"; read from outside while it holds the open backend "
             f"{med([s['rss_held'] for s in held]) / 1e3:.1f} MB; nvidia-smi "
             f"per-process GPU memory {held[-1]['apps'].split(',')[-1].strip()} MiB"
             if held else "")
          + f". Device memory in use (cuMemGetInfo total - free, nothing else on the GPU): "
          f"after the context {m['after_context'] / 2**20:.1f} MiB, after opening the backend "
          f"{m['after_open'] / 2**20:.1f} MiB, after the first frame "
          f"{m['after_first_frame'] / 2**20:.1f} MiB"
          + (f", after 100 frames {m['after_100_frames'] / 2**20:.1f} MiB" if 'after_100_frames' in m else "")
          + ".")

    if a.img:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        img = Path(a.img)
        img.mkdir(parents=True, exist_ok=True)
        for title, data, fname in (("GPU frame: upload + preprocess + conv2d 5x5 + download",
                                    rows, "gpu_vs_torch_frame.png"),
                                   ("Device work only: preprocess + conv2d 5x5", dev_rows,
                                    "gpu_vs_torch_device.png")):
            fig, ax = plt.subplots(figsize=(9, 4.5))
            labels = ["vision_preproc", "torch eager", "torch CUDA graph", "torch.compile"]
            width = 0.2
            for k, lab in enumerate(labels):
                ys, lo, hi = [], [], []
                for c in cases:
                    o, t = data[c]
                    v = o if k == 0 else t[MODES[k - 1]]
                    ys.append(med(v) if v else 0)
                    lo.append(med(v) - min(v) if v else 0)
                    hi.append(max(v) - med(v) if v else 0)
                xs = [i + (k - 1.5) * width for i in range(len(cases))]
                ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=lab)
                for x, y in zip(xs, ys):
                    ax.text(x, y, f"{y:.0f}", ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(cases)))
            ax.set_xticklabels([c.replace(" -> ", "\n-> ") for c in cases], fontsize=8)
            ax.set_ylabel("p50 per frame, us (bars: median of 5 runs; whiskers: min-max)")
            ax.set_yscale("log")
            ax.set_title(f"{title}\n{dev['name']}, {d['date_utc'][:10]}, commit {d['commit'][:7]}",
                         fontsize=10)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(img / fname, dpi=110)
            plt.close(fig)
        if st:
            fig, ax = plt.subplots(figsize=(9, 4))
            names = [f"{s['kind'].split(' ')[0].split(',')[0]}{'*' if 'fresh' in s['kind'] else ''}"
                     f" #{i}" for i, s in enumerate(st)]
            ctx = [s["ctx"] for s in st]
            op = [s["open"] for s in st]
            fr = [s["frame"] for s in st]
            other = [max(0.0, s["total"] - s["ctx"] - s["open"] - s["frame"]) for s in st]
            b = [0.0] * len(st)
            for lab, v in (("process start, libraries", other), ("CUDA context", ctx),
                           ("backend open (kernels)", op), ("first 1920x1080 frame", fr)):
                ax.bar(range(len(st)), v, bottom=b, label=lab)
                b = [x + y for x, y in zip(b, v)]
            ax.axhline(1000, color="r", ls="--", lw=1, label="goal cold 1 s")
            ax.axhline(300, color="g", ls="--", lw=1, label="goal warm 0.3 s")
            ax.set_yscale("log")
            ax.set_xticks(range(len(st)))
            ax.set_xticklabels(names, rotation=60, fontsize=7)
            ax.set_ylabel("ms (log)")
            ax.set_title("Start-up: process start -> first tensor (* = first process on a fresh "
                         "machine)", fontsize=10)
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(img / "startup.png", dpi=110)
            plt.close(fig)


if __name__ == "__main__":
    main()
