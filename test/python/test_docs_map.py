"""docs/ARCHITECTURE.md's folder map names every file and folder under src/, and nothing
under src/ that does not exist (a file added without its line, like
src/backend/cuda/registry.rs once, fails here; so does a line left for a file moved away).

How a line of the map names things. The map is the first fenced block under
"## The folder map". A line's head is its text after the indentation, up to the first run
of two or more spaces (the description follows). A line names files and folders when every
word of its head is a name: a file name with an extension (`mod.rs`, `vformat.c`) or a
folder name ending in `/` (`node/`).
- A name with a `/` inside it (`src/ros/`, `src/bin/vision_preproc_node.rs`) is a path from
  the repository's root.
- A plain name (`mod.rs`, `node/`) lies in the folder of the nearest line above it that is
  less indented and names exactly one folder (at the left margin, with no such line: the
  repository's root).
So `src/pipeline/inflight.rs` is named by a line `inflight.rs ...` indented under the line
`pipeline/`, itself indented under `src/`. Continuation lines of a description start with
prose, and the tree drawing's `│` lines name nothing. Every folder is named by a line of its
own (an entry for it, its files indented under it)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*/?")


def is_name(word: str) -> bool:
    return bool(NAME.fullmatch(word)) and (word.endswith("/") or "." in word.split("/")[-1])


def map_lines(text: str) -> list[str]:
    section = text.split("## The folder map", 1)[1]
    return section.split("```", 2)[1].split("\n")[1:]


def named_paths(lines: list[str]) -> set[str]:
    """Every path the map names, relative to the root; folders end in `/`."""
    named: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indentation, folder path) of the enclosing entries
    for line in lines:
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        words = re.split(r" {2,}", body, maxsplit=1)[0].split(" ")
        if not body or not all(is_name(w) for w in words):
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        paths = [w if "/" in w.rstrip("/") else parent + w for w in words]
        named.update(paths)
        if len(paths) == 1 and paths[0].endswith("/"):
            stack.append((indent, paths[0]))
    return named


def tree(folder: str) -> set[str]:
    out = set()
    for p in (ROOT / folder).rglob("*"):
        if "__pycache__" in p.parts:
            continue
        rel = p.relative_to(ROOT).as_posix()
        out.add(rel + "/" if p.is_dir() else rel)
    return out | {folder + "/"}


def test_the_folder_map_names_every_file_and_folder_of_src() -> None:
    named = named_paths(map_lines((ROOT / "docs" / "ARCHITECTURE.md").read_text()))
    actual = tree("src")
    in_src = {p for p in named if p.startswith("src/")}
    assert not actual - named, f"in src/ but not in ARCHITECTURE.md's map: {sorted(actual - named)}"
    assert not in_src - actual, f"in the map but not in src/: {sorted(in_src - actual)}"


def test_the_rule_reads_nesting_and_root_paths() -> None:
    lines = [
        "Cargo.toml build.rs   the crate",
        "src/              the crate",
        "  lib.rs          the root",
        "  ros/            ALL r2r code",
        "    node/           the node:",
        "      mod.rs          wiring",
        "                      mod.rs and the rest of a description (prose: names nothing)",
        "    dds.rs play.rs   two files of ros/",
        "        │",
        "  config.rs image.rs   the vocabulary",
        "src/consumer.rs   a root path",
        "kernels/          CUDA C",
    ]
    assert named_paths(lines) == {
        "Cargo.toml", "build.rs", "src/", "src/lib.rs", "src/ros/", "src/ros/node/",
        "src/ros/node/mod.rs", "src/ros/dds.rs", "src/ros/play.rs", "src/config.rs",
        "src/image.rs", "src/consumer.rs", "kernels/",
    }
