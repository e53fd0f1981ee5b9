"""Which Fast DDS this environment's ROS 2 runs on, and the variable it reads its XML
profile from: Fast DDS 2 (ROS 2 Jazzy's 2.14) reads only FASTRTPS_DEFAULT_PROFILES_FILE
and silently ignores FASTDDS_DEFAULT_PROFILES_FILE; Fast DDS 3 (Kilted on) reads
FASTDDS_DEFAULT_PROFILES_FILE and warns on the old name, even beside the new one. The node
asks the same question of the library it loaded (src/ros/dds.rs `FastDds`).

    python3 -m vptools.fastdds        prints the variable's name (for shell scripts)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

PROFILE_VAR_3 = "FASTDDS_DEFAULT_PROFILES_FILE"
PROFILE_VAR_2 = "FASTRTPS_DEFAULT_PROFILES_FILE"
#: Both names: a process meant to run without a profile is started with neither.
PROFILE_VARS = (PROFILE_VAR_3, PROFILE_VAR_2)

_LIB = re.compile(r"^lib(?:fastdds|fastrtps)\.so\.(\d+)(?:\.(\d+))?(?:\.(\d+))?$")


def version(search: list[str] | None = None) -> tuple[int, int, int] | None:
    """The version of the Fast DDS library on LD_LIBRARY_PATH (or `search`), if any: of the
    first folder that holds one, the name with the most numbers (libfastrtps.so.2.14.5
    beside its links libfastrtps.so.2.14 and .so); a library there only under its SONAME
    (libfastrtps.so.2.14, as scripts/device/ros_bundle.sh bundles it) gives the numbers
    its name has, 0 for the rest."""
    dirs = search if search is not None else [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        found = [m for m in map(_LIB.match, names) if m]
        if found:
            best = max(found, key=lambda m: (sum(g is not None for g in m.groups()), m[0]))
            return tuple(int(g or 0) for g in best.groups())
    return None


def profile_var(search: list[str] | None = None) -> str:
    """The variable the installed Fast DDS reads its profile from (Fast DDS 3's name when
    none is found)."""
    v = version(search)
    return PROFILE_VAR_2 if v is not None and v[0] < 3 else PROFILE_VAR_3


def with_profile(env: dict, profile: Path | str | None) -> dict:
    """`env` without either profile variable, then with `profile` under the name the
    installed Fast DDS reads (None: no profile)."""
    out = {k: v for k, v in env.items() if k not in PROFILE_VARS}
    if profile is not None:
        out[profile_var()] = str(profile)
    return out


if __name__ == "__main__":
    print(profile_var())
