#!/usr/bin/env python3
"""The ROS node's scenarios on the GPU machine: the command line of vptools.node_scenarios
(python/vptools/node_scenarios/: the command line in __init__.py, one module per family of
scenarios), where the scenarios, their knobs and `--help` live.

    PYTHONPATH=python python3 scripts/device/gpu_node_remote.py [scenario ...]   (there)
    python3 scripts/device/gpu_node_remote.py --list                            (here, in the venv)
"""

import sys

from vptools.node_scenarios import main

if __name__ == "__main__":
    sys.exit(main())
