#!/usr/bin/env python3
"""PNG plots for docs/BENCHMARKS.md from the JSON under docs/evidence/ (CPU machine):

  cpu.json          -> docs/img/cpu_matrix.png    vision_preproc vs OpenCV + NumPy, 3 sizes x 3 encodings
  node.json         -> docs/img/node_dds.png      the node through DDS vs the Python reference node
  startup.json      -> docs/img/startup_cpu.png   start -> first tensor (cold, warm) and RSS at 1080p
  shm_<N>mb.json    -> docs/img/shm_segment.png   RSS and delivery against the Fast DDS segment size

Files that are missing are skipped. Usage: python3 bench/plot.py [--results docs/evidence] [--img docs/img]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, median - min, max - median) for an error bar."""
    v = np.array([x for x in values if x is not None and x == x], float)
    if v.size == 0:
        return float("nan"), 0.0, 0.0
    m = float(np.median(v))
    return m, m - float(v.min()), float(v.max()) - m


def caption(meta: dict, extra: str = "") -> str:
    machine = f"{meta['cpus']} CPUs" if "cpus" in meta else meta.get("machine", "")
    return f"{meta.get('date', '')}, commit {meta.get('commit', '?')}, {machine}{extra}"


def plot_cpu(data: dict, out: Path) -> None:
    runs = data["runs"]
    names = [s["name"] for s in runs[0]["scenarios"]]
    x = np.arange(len(names))
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(12, 8), gridspec_kw={"height_ratios": [3, 2]}, sharex=True)
    for k, (key, label, color) in enumerate((("ours", "vision_preproc (CPU backend)", "tab:blue"),
                                             ("typical", "OpenCV + NumPy (typical)", "tab:orange"),
                                             ("exact", "OpenCV + NumPy (float resize)", "tab:gray"))):
        stats = [spread([r["scenarios"][j][key]["p50_ms"] for r in runs]) for j in range(len(names))]
        m = [s[0] for s in stats]
        err = np.array([[s[1] for s in stats], [s[2] for s in stats]])
        ax.bar(x + (k - 1) * 0.27, m, 0.27, yerr=err, capsize=3, label=label, color=color)
    ax.set_yscale("log")
    ax.set_ylabel("p50 ms per frame (log)")
    ax.legend()
    ax.set_title("CPU backend vs OpenCV + NumPy, 2-core machine (median of runs, bars: min-max)")
    ratio = [spread([r["scenarios"][j]["ratio_p50"] for r in runs]) for j in range(len(names))]
    ax2.bar(x, [r[0] for r in ratio], 0.5, yerr=np.array([[r[1] for r in ratio], [r[2] for r in ratio]]),
            capsize=3, color="tab:green")
    for xi, r in zip(x, ratio):
        ax2.text(xi, r[0] + r[2], f"{r[0]:.1f}x", ha="center", va="bottom", fontsize=8)
    ax2.axhline(1, color="k", lw=0.8)
    ax2.set_ylabel("speed-up p50 (typical / ours)")
    ax2.set_xticks(x, [n.replace(" -> ", "\n-> ") for n in names], fontsize=8)
    fig.text(0.01, 0.005, caption(data["meta"], f"; {len(runs)} runs"), fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_node(data: dict, out: Path) -> None:
    res = data["results"]
    groups: dict = {}
    for r in res:
        groups.setdefault((r["size"], r["rate"], r.get("publisher", "rust")), {}).setdefault(r["node"], []).append(r)
    keys = list(groups)
    x = np.arange(len(keys))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    colors = {"vision_preproc": "tab:blue", "reference": "tab:orange"}
    for k, node in enumerate(("vision_preproc", "reference")):
        off = (k - 0.5) * 0.38
        for ax, metric, title in ((axes[0], "added_ms", "node-added latency ms (bar p50, dot p99)"),
                                  (axes[1], "e2e_ms", "end-to-end latency ms (bar p50, dot p99)")):
            p50 = [spread([r[f"{metric}_p50"] for r in groups[g].get(node, [])]) for g in keys]
            p99 = [spread([r[f"{metric}_p99"] for r in groups[g].get(node, [])]) for g in keys]
            ax.bar(x + off, [p[0] for p in p50], 0.38, color=colors[node], alpha=0.8, label=node,
                   yerr=np.array([[p[1] for p in p50], [p[2] for p in p50]]), capsize=2)
            ax.errorbar(x + off, [p[0] for p in p99], yerr=np.array([[p[1] for p in p99], [p[2] for p in p99]]),
                        fmt="o", color="k", ms=4, capsize=2)
            ax.set_title(title, fontsize=10)
        fps = [spread([r["fps"] for r in groups[g].get(node, [])]) for g in keys]
        axes[2].bar(x + off, [f[0] for f in fps], 0.38, color=colors[node], label=node,
                    yerr=np.array([[f[1] for f in fps], [f[2] for f in fps]]), capsize=2)
        for xi, g in zip(x, keys):
            rs = groups[g].get(node, [])
            sent = sum(r["sent"] for r in rs)
            lost = sum(r["dropped"] or 0 for r in rs)
            if rs:
                axes[2].text(xi + off, 1, f"drop\n{100 * lost / max(1, sent):.0f}%", ha="center", fontsize=7)
    axes[2].set_title("achieved fps (tensors received); drops % of sent", fontsize=10)
    for ax in axes:
        ax.set_xticks(x, [f"{s}\n{r} Hz" + ("" if p == "rust" else f"\n{p} pub") for s, r, p in keys], fontsize=8)
        ax.legend(fontsize=8)
    fig.suptitle("vision_preproc_node (CPU backend) vs rclpy + OpenCV reference node, through Fast DDS")
    fig.text(0.01, 0.005, caption(data["meta"]), fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_startup(data: dict, out: Path) -> None:
    res = [r for r in data["results"] if r["kind"] in ("cold", "warm")]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    x = np.arange(len(res))
    a = np.array([r["to_backend_log_s"] for r in res])
    b = np.array([r["to_first_frame_stamp_s"] for r in res]) - a
    c = np.array([r["frame_to_tensor_s"] for r in res])
    ax.bar(x, a, color="tab:blue", label="process start -> node ready (rcl, DDS participant, backend)")
    ax.bar(x, b, bottom=a, color="tab:cyan", label="-> first frame (subscription, discovery, next frame)")
    ax.bar(x, c, bottom=a + b, color="tab:green", label="-> tensor received (preprocess + delivery)")
    seq = [r.get("first_timing_sequence") for r in res]
    node_side = [r["first_tensor_s"] - k / 30.0 if k is not None else np.nan for r, k in zip(res, seq)]
    ax.plot(x, node_side, "kx", ms=8, label="node published its first tensor (est. from FrameTiming.sequence)")
    ax.axhline(1.0, color="r", ls="--", lw=0.8, label="goal cold 1 s")
    ax.axhline(0.3, color="m", ls="--", lw=0.8, label="goal warm 0.3 s")
    ax.set_xticks(x, [r["kind"] for r in res], fontsize=7, rotation=90)
    ax.set_ylabel("s")
    ax.set_title("start -> first tensor at 1920x1080 bgr8 (CPU backend), per trial", fontsize=10)
    ax.legend(fontsize=7)
    anon = spread([r["rss_mb_max"]["RssAnon"] for r in res])
    shm = spread([r["rss_mb_max"]["RssShmem"] for r in res])
    fil = spread([r["rss_mb_max"]["RssFile"] for r in res])
    ax2.bar([0], [anon[0]], color="tab:blue", label=f"RssAnon (heap) {anon[0]:.0f}")
    ax2.bar([0], [fil[0]], bottom=[anon[0]], color="tab:gray", label=f"RssFile (code) {fil[0]:.0f}")
    ax2.bar([0], [shm[0]], bottom=[anon[0] + fil[0]], color="tab:orange", label=f"RssShmem (DDS SHM) {shm[0]:.0f}")
    ax2.axhline(100, color="r", ls="--", lw=0.8, label="goal 100 MB")
    ax2.set_xticks([0], ["node RSS MB\n(max while running)"])
    ax2.legend(fontsize=7)
    fig.text(0.01, 0.005, caption(data["meta"], f"; {data['meta'].get('transport', '').split('/')[-1]}"), fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_shm(files: list[Path], out: Path) -> None:
    rows = []
    for f in files:
        mb = int(re.search(r"shm_(\d+)mb", f.name).group(1))
        d = json.loads(f.read_text())
        for r in d["results"]:
            rows.append((mb, r))
    sizes = sorted({m for m, _ in rows})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, color in (("node_RssShmem_max_mb", "tab:orange"), ("node_RssAnon_max_mb", "tab:blue"),
                       ("node_VmRSS_max_mb", "k")):
        s = [spread([r[key] for m, r in rows if m == mb]) for mb in sizes]
        ax.errorbar(sizes, [v[0] for v in s], yerr=np.array([[v[1] for v in s], [v[2] for v in s]]), marker="o",
                    color=color, capsize=3, label=key.replace("node_", "").replace("_max_mb", ""))
    ax.axhline(100, color="r", ls="--", lw=0.8, label="goal 100 MB")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("Fast DDS SHM segment MB (every participant)")
    ax.set_ylabel("node RSS MB (max)")
    ax.legend(fontsize=8)
    for node_size in sorted({r["size"] for _, r in rows}):
        s = [spread([100 * r["tensors"] / max(1, r["sent"]) for m, r in rows if m == mb and r["size"] == node_size])
             for mb in sizes]
        ax2.errorbar(sizes, [v[0] for v in s], yerr=np.array([[v[1] for v in s], [v[2] for v in s]]), marker="o",
                     capsize=3, label=f"{node_size} bgr8 30 Hz")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(sizes, [str(s) for s in sizes])
    ax2.set_xlabel("Fast DDS SHM segment MB")
    ax2.set_ylabel("% of published frames whose tensor arrived")
    ax2.legend(fontsize=8)
    fig.suptitle("vision_preproc_node RSS and delivery vs the Fast DDS shared-memory segment size")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(ROOT / "docs" / "evidence"))
    ap.add_argument("--img", default=str(ROOT / "docs" / "img"))
    a = ap.parse_args()
    res, img = Path(a.results), Path(a.img)
    img.mkdir(parents=True, exist_ok=True)
    for name, fn, png in (("cpu.json", plot_cpu, "cpu_matrix.png"), ("node.json", plot_node, "node_dds.png"),
                          ("startup.json", plot_startup, "startup_cpu.png")):
        if (res / name).exists():
            fn(json.loads((res / name).read_text()), img / png)
            print(f"wrote {img / png}")
    shm = sorted(res.glob("shm_*mb.json"))
    if shm:
        plot_shm(shm, img / "shm_segment.png")
        print(f"wrote {img / 'shm_segment.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
