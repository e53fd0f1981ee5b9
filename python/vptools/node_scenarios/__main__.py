"""`python3 -m vptools.node_scenarios`: the command line (the rclpy peers start so)."""

import sys

from vptools.node_scenarios import main

sys.exit(main())
