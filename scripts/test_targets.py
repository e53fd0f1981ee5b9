#!/usr/bin/env python3
"""The `cargo test` arguments of scripts/test.sh's Rust stage, read from Cargo.toml
(`cargo metadata`): `--test=NAME` for every integration test but those named on the
command line (run apart), `--bin=NAME` for every binary whose unit tests run (`test` on).

    cargo metadata --no-deps --format-version 1 | python3 scripts/test_targets.py nvrtc_compile
"""

import json
import sys


def arguments(metadata: dict, apart: set[str]) -> list[str]:
    targets = [t for p in metadata["packages"] if p["name"] == "vision_preproc" for t in p["targets"]]
    out = []
    for t in targets:
        if "test" in t["kind"] and t["name"] not in apart:
            out.append("--test=" + t["name"])
        elif "bin" in t["kind"] and t["test"]:
            out.append("--bin=" + t["name"])
    return out


if __name__ == "__main__":
    print("\n".join(arguments(json.load(sys.stdin), set(sys.argv[1:]))))
