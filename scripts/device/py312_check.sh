#!/usr/bin/env bash
# Check .device/py312.tar.xz (scripts/device/py312_bundle.sh) as the GPU machine would use it:
# unpack it into a fresh temp dir, take a Python 3.12 whose venv holds numpy and nothing
# else (the target's python3 has its own numpy), source only the bundle's env.sh, then
#   - import rclpy, vision_preproc_msgs.msg (TensorRef, Tensor, TensorBatch, FrameTiming)
#     and vision_preproc_consumer;
#   - a DDS round trip between two processes: one publishes a Tensor and a TensorRef, the
#     other receives both and asserts their field values (15 s timeout);
#   - every shared library the two processes mapped comes from the bundle, the system
#     (/lib, /usr/lib) or the interpreter and its numpy, never from this repo's .ros, the
#     build venv or the msgs build tree.
# Twice: (1) the caller's environment, with this repo's .ros/env.sh sourced if there is
# one, then the bundle's env.sh on top; (2) `env -i` with only PATH and HOME, no .ros.
#
#   scripts/device/py312_check.sh     # prints "py312_check: PASS" and exits 0 when all holds
#   PY312_TARGET_PYTHON=python3 scripts/device/py312_check.sh   # on the GPU machine: its python3
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY312="${PY312:-/root/.pyenv/versions/3.12.1/bin/python3.12}"
NPVENV="${PY312_NUMPY_VENV:-/tmp/py312numpy}"
TARBALL="${1:-$ROOT/.device/py312.tar.xz}"
[ -f "$TARBALL" ] || { echo "py312_check: $TARBALL missing (run scripts/device/py312_bundle.sh)" >&2; exit 1; }

if [ -n "${PY312_TARGET_PYTHON:-}" ]; then
    # On the target itself: its python3 and its own numpy (PY312_TARGET_PYTHON=python3).
    PY="$(command -v "$PY312_TARGET_PYTHON")"
else
    # The target's stand-in: a 3.12 venv with numpy 2.5 only (no --system-site-packages).
    if ! "$NPVENV/bin/python" -c 'import numpy' 2>/dev/null; then
        rm -rf "$NPVENV"
        "$PY312" -m venv "$NPVENV"
        "$NPVENV/bin/python" -m pip install -q --disable-pip-version-check 'numpy==2.5.*'
    fi
    PY="$NPVENV/bin/python"
fi
# Where the interpreter's numpy lies (its site-packages): allowed besides the bundle.
NPSITE="$("$PY" -c 'import os, numpy; print(os.path.dirname(os.path.dirname(numpy.__file__)))')"

T="$(mktemp -d /tmp/py312_check.XXXXXX)"
trap 'rm -rf "$T"' EXIT
tar xJf "$TARBALL" -C "$T"
mkdir -p "$T/home"
B="$T/py312"

cat >"$T/roundtrip.py" <<'PY'
import array, hashlib, os, sys, time
role, py_prefix = sys.argv[1], sys.argv[2]
import numpy as np
import rclpy
from rclpy.node import Node
from vision_preproc_msgs.msg import BatchItem, FrameTiming, Tensor, TensorBatch, TensorRef
import vision_preproc_consumer
from vision_preproc_consumer import TensorRefSubscription  # noqa: F401  (needs rclpy)

bundle = os.environ["VP312_BUNDLE"]
for mod in (rclpy, vision_preproc_consumer, sys.modules["vision_preproc_msgs.msg._tensor"]):
    assert mod.__file__.startswith(bundle), (mod.__name__, mod.__file__)
assert np.__file__.startswith(py_prefix), np.__file__  # the interpreter's numpy, not bundled
assert FrameTiming.OUTPUT_TENSOR_REF == 2 and TensorRef.MEMORY_CUDA == 1
TensorBatch(items=[BatchItem(topic="/a")])

PAYLOAD = np.arange(1 * 3 * 4 * 5, dtype="<f4").tobytes()
UUID = list(range(16, 32))

def make():
    t = Tensor(name="images", layout="NCHW", dtype="float32", shape=[1, 3, 4, 5],
               data=array.array("B", PAYLOAD), scale_x=0.5, scale_y=0.25, offset_x=1.5,
               offset_y=-2.0, source_width=1280, source_height=720, source_encoding="bgr8")
    t.header.frame_id = "cam0"
    t.header.stamp.sec, t.header.stamp.nanosec = 1234, 5678
    r = TensorRef(name="images", layout="NCHW", dtype="float32", shape=[1, 3, 4, 5],
                  dtype_code=2, dtype_bits=32, dtype_lanes=1, strides=[60, 20, 5, 1],
                  byte_offset=4096, byte_size=240, pool_id="pool-py312",
                  socket_path="/tmp/vp.sock", block_index=7, block_size=1 << 20,
                  generation=42, memory_kind=TensorRef.MEMORY_CUDA, device_id=0,
                  device_uuid=np.array(UUID, dtype=np.uint8),
                  ipc_event_handle=array.array("B", bytes(range(64))),
                  items=[BatchItem(topic="/cam0/image", valid=True, source_width=1280)])
    r.header.frame_id = "cam0"
    return t, r

rclpy.init()
node = Node(f"py312_check_{role}")
if role == "import":
    print(f"imports ok: python {sys.version.split()[0]}, numpy {np.__version__}, rclpy {rclpy.__file__}")
elif role == "pub":
    pt = node.create_publisher(Tensor, "/py312_check/tensor", 10)
    pr = node.create_publisher(TensorRef, "/py312_check/tensor_ref", 10)
    t, r = make()
    stop, end = os.environ["VP312_STOP"], time.monotonic() + 20
    while time.monotonic() < end and not os.path.exists(stop):  # until the subscriber is done
        pt.publish(t); pr.publish(r)
        rclpy.spin_once(node, timeout_sec=0.1)
elif role == "sub":
    got = {}
    node.create_subscription(Tensor, "/py312_check/tensor", lambda m: got.setdefault("t", m), 10)
    node.create_subscription(TensorRef, "/py312_check/tensor_ref", lambda m: got.setdefault("r", m), 10)
    end = time.monotonic() + 15
    while len(got) < 2 and time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.1)
    open(os.environ["VP312_STOP"], "w").close()
    assert len(got) == 2, f"timeout: received only {sorted(got)}"
    t, r = got["t"], got["r"]
    assert (t.name, t.layout, t.dtype, list(t.shape)) == ("images", "NCHW", "float32", [1, 3, 4, 5])
    assert bytes(t.data) == PAYLOAD, "tensor bytes differ"
    assert np.array_equal(np.frombuffer(bytes(t.data), "<f4"), np.arange(60, dtype="f4"))
    assert (t.scale_x, t.scale_y, t.offset_x, t.offset_y) == (0.5, 0.25, 1.5, -2.0)
    assert (t.source_width, t.source_height, t.source_encoding) == (1280, 720, "bgr8")
    assert (t.header.frame_id, t.header.stamp.sec, t.header.stamp.nanosec) == ("cam0", 1234, 5678)
    assert (r.pool_id, r.socket_path, r.block_index, r.block_size, r.generation) == \
        ("pool-py312", "/tmp/vp.sock", 7, 1 << 20, 42)
    assert (r.dtype_code, r.dtype_bits, r.dtype_lanes, list(r.strides)) == (2, 32, 1, [60, 20, 5, 1])
    assert (r.byte_offset, r.byte_size, r.memory_kind, r.device_id) == (4096, 240, 1, 0)
    assert list(r.device_uuid) == UUID and bytes(r.ipc_event_handle) == bytes(range(64))
    assert [(i.topic, i.valid, i.source_width) for i in r.items] == [("/cam0/image", True, 1280)]
    print(f"round trip ok: Tensor {len(t.data)} B sha {hashlib.sha256(bytes(t.data)).hexdigest()[:12]}, "
          f"TensorRef pool {r.pool_id} block {r.block_index} gen {r.generation}")
# Every mapped shared library: the bundle, the system, or the interpreter (+ its numpy).
py_base = os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(sys.executable)), ".."))
allowed = (bundle, "/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", py_prefix, py_base)
libs = {l.split()[5] for l in open("/proc/self/maps") if len(l.split()) > 5 and ".so" in l.split()[5]}
foreign = sorted(p for p in libs if not p.startswith(allowed))
assert not foreign, f"libraries from outside the bundle: {foreign}"
n_bundle = sum(p.startswith(bundle) for p in libs)
# Every imported module: the bundle, the interpreter's standard library, or numpy.
import sysconfig
std = tuple(f(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")
            for f in (os.path.abspath, os.path.realpath))
mods = {getattr(m, "__file__", None) for m in list(sys.modules.values())} - {None, os.path.abspath(__file__)}
strays = sorted(f for f in mods if not f.startswith((bundle, py_prefix) + std))
assert not strays, f"modules from outside the bundle: {strays}"
print(f"{role}: {len(libs)} shared libraries mapped, {n_bundle} from the bundle; {len(mods)} modules; none foreign")
node.destroy_node()
rclpy.shutdown()
PY

run_case() {  # label, then the command prefix that gives the environment
    local label="$1"; shift
    local dom=$((200 + RANDOM % 30))
    echo "== $label (ROS_DOMAIN_ID=$dom)"
    "$@" bash -c '
        set -euo pipefail
        source "$0/env.sh"
        export VP312_BUNDLE="$0" VP312_STOP="$4.$1.stop" ROS_DOMAIN_ID="$1" ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
        case ":$LD_LIBRARY_PATH:$PYTHONPATH:" in *"/.ros/"*|*"/.ros-"*) echo "(.ros is on LD_LIBRARY_PATH/PYTHONPATH, after the bundle)";; esac
        py="$2"; prefix="$3"; script="$4"
        "$py" "$script" import "$prefix"
        "$py" "$script" sub "$prefix" & sub=$!
        "$py" "$script" pub "$prefix" & pub=$!
        rc=0; wait $sub || rc=$?
        wait $pub || rc=$?
        exit $rc
    ' "$B" "$dom" "$PY" "$NPSITE" "$T/roundtrip.py"
}

# (1) The caller's environment; this repo's ROS environment too when it exists.
if [ -f "$ROOT/.ros/env.sh" ]; then
    run_case "caller's environment + $ROOT/.ros/env.sh + bundle env.sh" \
        bash -c 'source "$0/.ros/env.sh" && exec "$@"' "$ROOT"
else
    run_case "caller's environment (no $ROOT/.ros/env.sh here) + bundle env.sh" env
fi
# (2) Clean: env -i with PATH and HOME only, nothing of .ros anywhere.
run_case "env -i PATH HOME + bundle env.sh (no .ros)" env -i PATH=/usr/bin:/bin HOME="$T/home"
echo "py312_check: PASS ($(du -h "$TARBALL" | cut -f1) $TARBALL)"
