"""An inference consumer of `tensor_ref` in PyTorch (docs/HANDOFF.md): each tensor taken
in place (a CUDA tensor over the node's GPU block, or a CPU tensor over a host block:
no copy), run through a small randomly initialised conv net (no weights downloaded),
and the block given back once the net's work on it is done. Prints, once a second, the
frames run and skipped and the camera stamp -> network output latency (p50 / p99).

    vision_preproc_node --ros-args -p backend:=cuda &     # and a camera on `image`
    python3 examples/tensor_ref_torch.py /tensor_ref 10

Needs rclpy (the set-up's environment), torch, and for GPU blocks cuda-python.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time

import rclpy
import torch
from rclpy.executors import SingleThreadedExecutor

from vision_preproc_consumer import TensorRefSubscription


def net(channels: int, device: str) -> torch.nn.Module:
    """A small conv net: two strided 3x3 convolutions, pooled to 10 scores."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(channels, 16, 3, stride=2), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).to(device).eval()


def main() -> None:
    topic = sys.argv[1] if len(sys.argv) > 1 else "tensor_ref"
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    rclpy.init()
    node = rclpy.create_node("tensor_ref_torch")
    model: torch.nn.Module | None = None
    latencies: list[float] = []
    top = [-1]  # the last frame's best class (random weights: meaningless, but computed)
    stream = torch.cuda.Stream() if torch.cuda.is_available() else None

    def on_frame(frame) -> None:
        nonlocal model
        m = frame.msg
        view = frame.array()
        cuda = hasattr(view, "__cuda_array_interface__")
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext(), torch.no_grad():
            x = torch.as_tensor(view, device="cuda") if cuda else torch.from_numpy(view)
            if m.layout == "NHWC":
                x = x.permute(0, 3, 1, 2)
            if model is None:
                model = net(x.shape[1], "cuda" if cuda else "cpu")
            scores = model(x.float())
            if cuda:
                stream.synchronize()  # the scores are ready (and the block no longer read)
        frame.release(stream if cuda else None)
        stamp = m.header.stamp.sec + m.header.stamp.nanosec * 1e-9
        latencies.append((time.time() - stamp) * 1e3)
        top[0] = int(scores[0].argmax())

    sub = TensorRefSubscription(node, topic, on_frame)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    start = last = time.time()
    while time.time() - start < seconds:
        executor.spin_once(timeout_sec=0.01)
        if time.time() - last >= 1.0 and latencies:
            last = time.time()
            q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
            print(f"{len(latencies)} frames run, {sub.skipped} skipped; camera -> scores "
                  f"p50 {statistics.median(latencies):.2f} ms, p99 {q[98]:.2f} ms; last class {top[0]}", flush=True)
    sub.close()
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main()
