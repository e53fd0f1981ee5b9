"""vptools: the Python helpers of vision_preproc, shared by test/, bench/ and scripts/.

Importable in this checkout's venv (scripts/setup/setup.sh puts `python/` on its path with a
.pth file), so nothing here or in a caller edits sys.path:

    sources      raw frames of every encoding from the photographs of test/data
    oracle       the specification in OpenCV + NumPy (docs/SPEC.md); oracle_conv: conv2d
    tolerances   the named tolerances of test/tolerances.json and the checks that use them
    runner       the `vision_preproc` CLI on a frame, compared with the oracle
    bags         rosbag2 bags written and read with the `rosbags` library
    rosharness   real ROS 2 between processes: the node as a process, rclpy as the peer
                 (importing it sets this run's ROS_DOMAIN_ID; import it before rclpy)
    soak         soak and overload runs through real DDS (scripts/soak.py is its CLI)
    fastdds      the installed Fast DDS and the variable it reads its XML profile from
    procs        the node as a process, /proc readings (standard library only)
    node_scenarios  the node's scenarios on the GPU machine, one function each, a module per
                 family, standard library only (scripts/device/gpu_node_remote.py is its CLI)
"""

from pathlib import Path

#: The repository root.
ROOT = Path(__file__).resolve().parents[2]
#: The photographs (provenance and licences in test/data/README.md).
DATA = ROOT / "test" / "data"
#: The binaries `make build` produces.
BIN_DIR = ROOT / "target" / "release"
#: The binaries with the test hooks and the benchmarks (cargo features `fault-injection` and
#: `bench`: fault injection, `bench-cpu`, `bench-batch`, `conv-file`, `decode-file`), built by
#: scripts/test_hooks_build.sh (scripts/test.sh runs it).
HOOKS_BIN_DIR = ROOT / "target" / "fault-injection"
