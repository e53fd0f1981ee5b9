"""Cameras inside the node (`camera`: `gst:` inputs) and compressed inputs (`compressed`:
JPEG over DDS), with their parts under compute-sanitizer."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

from vptools.node_scenarios.common import (CONFIG, GST_GROUPS, GST_MODES, INPUTS4, JPEG_BAG, MEMCHECK, ROS_DIR,
                                           WORK, grep, gst_source, lines_of, nl, scenario)
from vptools.node_scenarios.handoff import cudaref_run
from vptools.node_scenarios.run import Run


@scenario
def camera(run: Run) -> None:
    """Cameras inside the node (`gst:` inputs, GStreamer from .device/gst.tar.xz), in one call:
      parity: every format of GST_GROUPS from live 1920x1080 pipelines, one node per group
        and backend (CUDA upload, CUDA mapped, CPU), 64x48 + gaussian 5 conv2d, 4 batches
        recorded each (OUT/camera_<mode>_<group>: compare them here, test/ros/test_camera.py's
        formats; the picture is the same in every frame)
      sanitizer: the YUV/Bayer group's node under compute-sanitizer memcheck, 25 s per CUDA
        memory mode (its start-up under the tool takes most of the first 10)
      bench: bench_handoff.py's three paths with the PyTorch consumer, 2 rounds: (s) camera
        process -> tensor + .cuda(), (a) -> tensor_ref, (b) the camera in the node -> tensor_ref;
        each round twice, the consumer on rclpy's SingleThreadedExecutor, then on its
        EventsExecutor (files events_<path>_<round>.json)
      signal: the consumer's ready signal (protocol 2, docs/HANDOFF.md), 2 rounds, the
        PyTorch consumer on the SingleThreadedExecutor: (s) -> tensor + .cuda(), (a) -> the
        TensorRef topic, (b) the camera in the node -> the pool's socket, (b) -> the
        TensorRef topic (files tensor, tensor_ref_topic, gst_ref, gst_topic _<round>.json;
        gst_ref's has the node's own report of the consumer); not in the default parts
      max: the highest single-camera rate, a source that is not live (frames as fast as they
        are taken) against PLAYERS `play --max` into the node through DDS, 6 s each, 2 trials
      restarts: a live 1080p pipeline that ends every 20 frames (restarted by the node each
        time: GStreamer frees the old pool's buffers, the new pool's are registered), under
        compute-sanitizer memcheck per CUDA memory mode, 30 s each: the restarts and the
        ledger (every frame read in place), not in the default parts
    CAMERA_PARTS: a subset of those, in that order."""
    if not run.gst:
        raise SystemExit("gpu_node_remote: camera needs .device/gst.tar.xz (scripts/device/gst_bundle.sh)")
    parts = run.k.camera_parts
    if not run.untar(run.stage / "py312.tar.xz", ROS_DIR):
        raise SystemExit(f"gpu_node_remote: cannot unpack {run.stage / 'py312.tar.xz'} (the consumers)")
    with run.tee("camera"):
        run.warm_up()
        for label, mode_args in GST_MODES if "parity" in parts else ():
            for g, group in enumerate(GST_GROUPS):
                tag, ns = f"camera_{label}_{g}", f"/gc{g}{label[:4]}{label[-1]}"
                inputs = "inputs:=[" + ",".join(f'"{gst_source(f, 1920, 1080)}"' for f in group) + "]"
                node = run.node(["-r", f"__ns:={ns}", *run.small(), *mode_args, "-p", inputs,
                                 "-p", "batch_timeout_ms:=400"], WORK / f"node_{tag}.log")
                rec = run.spawn([run.cli, "record", run.out / tag, "--batch", "--tensor-topic", f"{ns}/tensor",
                                 "--timing-topic", f"{ns}/timing", "--count", 4, "--duration", 40],
                                WORK / f"rec_{tag}.log")
                run.wait(rec)
                stop_recorded(run, tag, node, 1, r"WARN|ERROR|FATAL|backend|frames read|frame copies")
        if "sanitizer" in parts:
            camera_sanitizer(run)
        if "bench" in parts:
            for i in run.k.n(2):
                for run.executor in ("single", "events"):
                    cudaref_run(run, "tensor", i)
                    cudaref_run(run, "tensor_ref", i)
                    cudaref_run(run, "gst_ref", i)
            run.executor = "single"
        if "signal" in parts:
            for i in run.k.n(2):
                for mode in ("tensor", "tensor_ref_topic", "gst_ref", "gst_topic"):
                    cudaref_run(run, mode, i)
        new = run.node_bin.parent
        for i in run.k.n(2) if "max" in parts else ():
            run.single_max("new", new, i)
            gst_max(run, i)
        if "restarts" in parts:
            camera_restarts(run)


def gst_max(run: Run, trial: int) -> None:
    """The camera inside the node at its highest rate: a 1920x1080 BGR source that is not
    live (frames as fast as the node takes them) into one single-camera node (-> 640x640)
    for 6 s: published frames/s, each thread's CPU, node-added latency."""
    tag, ns = f"gstmax_{trial}", f"/gm{trial}"
    node = run.max_node(tag, ns, "-p", f'inputs:=["{gst_source("BGR", 1920, 1080, "", live=False)}"]')
    nlog, rate = run.max_window(tag, ns, node, "gst node", [])
    started = grep(r"GStreamer pipeline", nlog)
    print(f"gst max trial {trial} (not live, 1080p BGR): {nl(grep('stopped:.*', nlog, only=True))}; "
          f"published/s ~{rate}; {nl(started[:1])[:200]}")
    for line in grep("node-added", WORK / f"rec_{tag}.log"):
        print(f"  gst {line}")


@scenario
def compressed(run: Run) -> None:
    """Compressed inputs (`image_transport: compressed`; node_bags.tar.xz's JPEG_BAG, the
    1080p photographs as JPEG q90 4:2:0, from `play`), in one call:
      parity: one node per mode of GST_MODES (CUDA upload and CUDA mapped: nvJPEG; CPU: the
        CPU decoder), 64x48 + gaussian 5 conv2d, the bag's 8 frames played once and every
        tensor recorded (OUT/compressed_<mode>: compare them here,
        scripts/device/compare_compressed.py, within jpeg_gpu_decode)
      sanitizer: the CUDA node under compute-sanitizer memcheck, the bag looped 20 s
      bench: bench_handoff.py's (s), (a), (b) and (c) with the PyTorch consumer, 2 rounds:
        raw over DDS -> tensor + .cuda(), -> tensor_ref, the camera inside the node (the
        in-process source) -> tensor_ref, JPEG over DDS -> tensor_ref
      batch: four JPEG cameras (30 Hz each, phases not aligned) batched in one node with
        `inputs` of 4, 1080p -> 640x640, 10 s, then 15 s under compute-sanitizer memcheck
        (CUDA): the books, the batches' decode stage, the warm-up's start-up line
    COMPRESSED_PARTS: a subset of those four, in that order."""
    parts = run.k.compressed_parts
    if "bench" in parts and not run.untar(run.stage / "py312.tar.xz", ROS_DIR):
        raise SystemExit(f"gpu_node_remote: cannot unpack {run.stage / 'py312.tar.xz'} (the consumers)")
    bag = run.bags / JPEG_BAG
    with run.tee("compressed"):
        run.warm_up()
        for label, mode_args in GST_MODES if "parity" in parts else ():
            tag, ns = f"compressed_{label}", f"/jc{label[:4]}{label[-1]}"
            node = run.node(["-r", f"__ns:={ns}", *run.small(), *mode_args, "-p", "image_transport:=compressed"],
                            WORK / f"node_{tag}.log")
            rec = run.spawn([run.cli, "record", run.out / tag, "--tensor-topic", f"{ns}/tensor",
                             "--timing-topic", f"{ns}/timing", "--count", 8, "--duration", 40],
                            WORK / f"rec_{tag}.log")
            time.sleep(3)  # the recorder matched to the node's tensor before the first frame
            run.wait(run.player(bag, tag, "--image-topic", f"{ns}/image", "--wait-subscribers", 1))
            run.wait(rec)
            stop_recorded(run, tag, node, 2, r"WARN|ERROR|FATAL|backend|JPEG|rejected")
        if "sanitizer" in parts:
            tag = "compressed_sanitizer"
            node = run.node(["-r", "__ns:=/jcs", "-p", "backend:=cuda", *run.small(),
                             "-p", "image_transport:=compressed"], WORK / f"node_{tag}.log",
                            prefix=MEMCHECK)
            play = run.player(bag, tag, "--image-topic", "/jcs/image", "--loop", "--duration", 20,
                              "--wait-subscribers", 1)
            run.wait(play)
            stop_by_namespace("__ns:=/jcs")
            rc = run.wait(node)[0]
            nlog = WORK / f"node_{tag}.log"
            print(f"{tag}: exit {rc}; {nl(grep('stopped:.*', nlog, only=True))}; "
                  f"{nl(grep('ERROR SUMMARY.*', nlog))}")
            shutil.copy(nlog, run.out)
        if "bench" in parts:
            for i in run.k.n(2):
                cudaref_run(run, "tensor", i)
                cudaref_run(run, "tensor_ref", i)
                cudaref_run(run, "gst_ref", i)
                cudaref_run(run, "jpeg_ref", i)
        if "batch" in parts:
            compressed_batch(run, bag)


def compressed_batch(run: Run, bag: Path) -> None:
    """compressed's batch part: 4 players of `bag` into one node of 4 compressed inputs, a
    `record --batch --count-only` of its TensorBatch; plain, then under memcheck (CUDA)."""
    runs = [("batch", (), 10)] + ([("batch_sanitizer", MEMCHECK, 15)] if run.k.backend != "cpu" else [])
    for label, prefix, secs in runs:
        tag, ns = f"compressed_{label}", "/jb"
        nlog = WORK / f"node_{tag}.log"
        node = run.node(["-r", f"__ns:={ns}", "--params-file", CONFIG, "-p", f"backend:={run.k.backend}",
                         "-p", "network_image_width:=640", "-p", "network_image_height:=640", "-p", INPUTS4,
                         "-p", "image_transport:=compressed"], nlog, prefix=prefix)
        rec = run.spawn([run.cli, "record", "--count-only", "--batch", "--tensor-topic", f"{ns}/tensor",
                         "--timing-topic", f"{ns}/timing", "--duration", secs + 25], WORK / f"rec_{tag}.log")
        plays = []
        for k in range(4):
            plays.append(run.player(bag, f"{tag}_{k}", "--loop", "--restamp", "--duration", secs,
                                    "--image-topic", f"{ns}/cam{k}/image", "--camera-info-topic",
                                    f"{ns}/cam{k}/camera_info", "--wait-subscribers", 1, limit=90))
            time.sleep(random.randrange(9) / 100)
        run.wait(*plays)
        time.sleep(2)
        if prefix:
            stop_by_namespace(f"__ns:={ns}")
            rc = run.wait(node)[0]
        else:
            rc = run.stop_node(node)
        run.term(rec)
        run.wait(rec)
        sent_ = [lines_of(p)[0] for p in sorted(WORK.glob(f"play_{tag}_*.log")) if lines_of(p)]
        print(f"{tag}: players {' / '.join(sent_)}; node exit {rc}; {nl(grep('stopped:.*', nlog, only=True))}; "
              f"{nl(grep('ERROR SUMMARY.*', nlog))}")
        for line in grep(r"JPEG: |WARN|ERROR|undecodable", nlog)[:6]:
            print(f"  {line[:300]}")
        for line in lines_of(WORK / f"rec_{tag}.log")[-4:]:
            print(f"  record: {line[:300]}")
        shutil.copy(nlog, run.out)


def stop_recorded(run: Run, tag: str, node, rec_lines: int, pattern: str) -> None:
    """Stop a parity node whose recorder finished, print the recorder's last `rec_lines`
    lines, the node's exit and books and its log lines matching `pattern`; keep its log."""
    rc = run.stop_node(node)
    nlog = WORK / f"node_{tag}.log"
    print(f"{tag}: {nl(lines_of(WORK / f'rec_{tag}.log')[-rec_lines:])}; node exit {rc}; "
          f"{nl(grep('stopped:.*', nlog, only=True))}")
    shutil.copy(nlog, run.out)
    for line in grep(pattern, nlog)[:6]:
        print(f"  {line[:260]}")


def stop_by_namespace(ns_arg: str) -> None:
    """SIGTERM the node started with `-r <ns_arg>`, wherever compute-sanitizer put it in
    its process tree (its direct children are not always the node)."""
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if ns_arg.encode() in cmdline and cmdline[0].endswith(b"vision_preproc_node"):
            os.kill(int(pid), signal.SIGTERM)


def camera_sanitizer(run: Run) -> None:
    """camera's sanitizer part: the YUV/Bayer group's node."""
    inputs = "inputs:=[" + ",".join(f'"{gst_source(f, 1920, 1080)}"' for f in GST_GROUPS[1]) + "]"
    camera_memcheck(run, "sanitizer", inputs, "/gcs", 25)


def camera_restarts(run: Run) -> None:
    """camera's restarts part: a live 1080p pipeline that ends every 20 frames."""
    inputs = f'inputs:=["{gst_source("BGR", 1920, 1080, "30/1", num_buffers=20)}"]'
    camera_memcheck(run, "restarts", inputs, "/gcr", 30)


def camera_memcheck(run: Run, part: str, inputs: str, ns: str, seconds: int) -> None:
    """A node of `inputs` (its `-p inputs:=` argument) under compute-sanitizer memcheck for
    `seconds`, once per CUDA memory mode of GST_MODES (upload: the upload reads GStreamer's
    registered buffers; mapped: the kernels do); prints its restarts (log lines, rate
    limited), each input's ledger, its books and the tool's summary."""
    for label, mode_args in GST_MODES[:2]:
        tag = f"camera_{part}_{label}"
        node = run.node(["-r", f"__ns:={ns}", *mode_args, *run.small(), "-p", inputs],
                        WORK / f"node_{tag}.log", prefix=MEMCHECK)
        time.sleep(seconds)
        stop_by_namespace(f"__ns:={ns}")
        rc = run.wait(node)[0]
        nlog = WORK / f"node_{tag}.log"
        restarts = len(grep("pipeline restarted", nlog))
        print(f"{tag}: exit {rc}; {restarts} restart log lines; {nl(grep('frame copies.*', nlog, only=True))}; "
              f"{nl(grep('stopped:.*', nlog, only=True))}; {nl(grep('ERROR SUMMARY.*', nlog))}")
        shutil.copy(nlog, run.out)
