#!/usr/bin/env python3
"""Soak and overload runs of vision_preproc_node through real DDS: the command line of
vptools.soak (python/vptools/soak.py), where the run, its checks and `--help` live."""

import sys

from vptools.soak import main

if __name__ == "__main__":
    sys.exit(main())
