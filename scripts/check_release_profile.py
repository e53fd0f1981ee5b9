#!/usr/bin/env python3
"""The product binaries hold no code of the crates Cargo.toml compiles at opt-level 0
(scripts/test.sh's stage `profile`, after `make build`).

[profile.release.package.*] in Cargo.toml builds some crates at opt-level 0: code
generators that only build scripts run (bindgen, syn, ...). If the product came to use one
of them, its code would run unoptimised in the node; `nm -C` of the product binaries must
name none of them. The check can fail: the build script that runs these generators
(r2r_msg_gen's) holds their code, and must name at least three.

    python3 scripts/check_release_profile.py        (from the repository root)
"""

import glob
import re
import subprocess
import sys
import tomllib

BINARIES = ["target/release/vision_preproc_node", "target/release/vision_preproc_lifecycle_node",
            "target/release/vision_preproc"]


def opt_level_0_crates() -> list[str]:
    packages = tomllib.load(open("Cargo.toml", "rb"))["profile"]["release"].get("package", {})
    return sorted(n.replace("-", "_") for n, p in packages.items() if str(p.get("opt-level")) == "0")


def found(binary: str, pattern: re.Pattern) -> list[str]:
    """The crates of `pattern` whose paths (`crate::`) the binary's symbols name."""
    nm = subprocess.run(["nm", "-C", binary], capture_output=True, text=True, check=True).stdout
    return sorted({m.group(1) for m in pattern.finditer(nm)})


def main() -> int:
    crates = opt_level_0_crates()
    pattern = re.compile(r"(?<![\w:])(%s)::" % "|".join(crates))
    for b in BINARIES:
        held = found(b, pattern)
        if held:
            print(f"{b} holds code of {held}, which Cargo.toml's [profile.release.package.*] compiles at "
                  "opt-level 0 (as code generators for build scripts only): remove the override of a crate "
                  "the product now uses", file=sys.stderr)
            return 1
    witness = found(glob.glob("target/release/build/r2r_msg_gen-*/build-script-build")[0], pattern)
    if len(witness) < 3:
        print(f"r2r_msg_gen's build script names only {witness} of {crates}: the check cannot see "
              "these crates' code (has the symbol format changed?)", file=sys.stderr)
        return 1
    print(f"{len(crates)} crates at opt-level 0 ({', '.join(crates)}): none in the product binaries; "
          f"r2r_msg_gen's build script holds {', '.join(witness)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
