"""The layering of docs/ARCHITECTURE.md, checked on the source text: which folder may name
which crate (r2r only in src/ros/, cudarc only in the CUDA backend and the benchmark) and
which module may import which (backend/ never imports pipeline/, ros/, transport/ or
bag/; nothing in the library imports ros/). Comments and the `#[cfg(test)]` modules at
the end of a file are not code here (a unit test of backend/ may build its case with
pipeline/). Each rule's detector is also shown to find what it forbids, so that none
can pass by matching nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vptools import ROOT

SRC = ROOT / "src"
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
TESTS = re.compile(r"^#\[cfg\(test\)\]\s*\nmod ", re.M)


def code(path: Path) -> str:
    """The Rust source of `path` without comments and without its trailing test module."""
    text = path.read_text()
    cut = TESTS.search(text)
    if cut:
        text = text[: cut.start()]
    return COMMENT.sub("", text)


def rust_files(*roots: Path) -> list[Path]:
    out: list[Path] = []
    for root in roots:
        out += [root] if root.is_file() else sorted(root.rglob("*.rs"))
    return out


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def naming(pattern: str, files: list[Path]) -> list[str]:
    """`file:line` of every code line in `files` that matches `pattern`."""
    rx = re.compile(pattern)
    hits = []
    for f in files:
        for n, line in enumerate(code(f).splitlines(), 1):
            if rx.search(line):
                hits.append(f"{rel(f)}:{n}: {line.strip()}")
    return hits


#: Every Rust source of the repository (the fuzz harness, the examples, the tests, build.rs).
ALL = rust_files(SRC, ROOT / "examples", ROOT / "test", ROOT / "fuzz" / "harness.rs",
                 ROOT / "fuzz" / "fuzz_targets", ROOT / "build.rs")


def under(*prefixes: str) -> list[Path]:
    return [f for f in ALL if rel(f).startswith(prefixes)]


def outside(*prefixes: str) -> list[Path]:
    return [f for f in ALL if not rel(f).startswith(prefixes)]


def imports(module: str) -> str:
    """A reference to the library module `module`: `crate::module` inside the library,
    `vision_preproc::module` from a binary, an example or a test."""
    return rf"\b(crate|vision_preproc)::{module}\b"


R2R = r"\br2r(_rcl)?\b"
CUDARC = r"\bcudarc\b"
GSTREAMER = r"\bgstreamer(_app|_video)?\s*(::|as\b)"

# (rule, forbidden pattern, the files that must not match, the files that must match)
RULES = [
    ("r2r is named only in src/ros/ (and test/ros_typed.rs, r2r's typed peer of the node, and "
     "examples/tensor_ref_consumer.rs, a consumer process of the node's tensor_ref)",
     R2R, outside("src/ros/", "test/ros_typed.rs", "examples/tensor_ref_consumer.rs"), under("src/ros/")),
    ("cudarc is named only in src/backend/cuda/, the benchmark and the GPU tests",
     CUDARC, outside("src/backend/cuda/", "src/bin/vision_preproc/bench/", "test/gpu_"),
     under("src/backend/cuda/")),
    ("backend/ never imports pipeline/, ros/, transport/ or bag/",
     imports("(pipeline|ros|transport|bag)"), under("src/backend/"), under("src/ros/")),
    ("pipeline/ never imports ros/ or transport/",
     imports("(ros|transport)"), under("src/pipeline/"), under("src/ros/")),
    ("transport/ never imports backend/, pipeline/ or ros/ (decisions without ROS types)",
     imports("(backend|pipeline|ros)"), under("src/transport/"), under("src/ros/")),
    ("handoff/ never imports backend/: the Rust consumer, which imports the CUDA blocks, "
     "sits above both (src/consumer.rs)",
     imports("backend"), under("src/handoff/"), under("src/consumer.rs")),
    ("capture/ (frames from GStreamer, no ROS) never imports ros/, backend/ or pipeline/",
     imports("(ros|backend|pipeline)"), under("src/capture/"), under("src/ros/")),
    ("gstreamer-rs is named only in src/capture/ and its test",
     GSTREAMER, outside("src/capture/", "test/gst_capture.rs"), under("src/capture/")),
    ("only the binaries call into ros/: no library module outside it imports it",
     imports("ros"), outside("src/ros/", "src/bin/", "test/", "src/lib.rs"),
     under("src/bin/vision_preproc_node.rs")),
]


@pytest.mark.parametrize("rule,pattern,forbidden,witness", RULES, ids=[r[0] for r in RULES])
def test_layering(rule: str, pattern: str, forbidden: list[Path], witness: list[Path]) -> None:
    assert forbidden, f"{rule}: no file to check (moved?)"
    assert naming(pattern, witness), f"{rule}: the detector finds nothing where it must"
    hits = naming(pattern, forbidden)
    assert hits == [], f"{rule}; found:\n" + "\n".join(hits)


def test_comments_and_unit_tests_are_not_code(tmp_path: Path) -> None:
    src = tmp_path / "x.rs"
    src.write_text("// r2r in a comment\n/* cudarc\n */ use crate::image;\n"
                   "fn f() {} // crate::ros\n#[cfg(test)]\nmod tests {\n    use crate::pipeline;\n}\n")
    assert code(src).split() == ["use", "crate::image;", "fn", "f()", "{}"]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph` (module -> the modules it imports), each as a path."""
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        path.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                found.append(path[path.index(v):] + [v])
            elif not state.get(v):
                visit(v, path)
        path.pop()
        state[u] = 2

    for u in sorted(graph):
        if not state.get(u):
            visit(u, [])
    return found


def library_graph() -> dict[str, set[str]]:
    """src/'s folders and top-level modules (ros_stub.rs counts as ros) -> the ones each
    names as `crate::<module>`."""
    top = lambda p: p.relative_to(SRC).parts[0].removesuffix(".rs").replace("ros_stub", "ros")  # noqa: E731
    files = [f for f in rust_files(SRC) if top(f) not in ("lib", "bin")]
    graph: dict[str, set[str]] = {top(f): set() for f in files}
    for f in files:
        graph[top(f)] |= {m for m in re.findall(r"\bcrate::(\w+)", code(f)) if m in graph and m != top(f)}
    return graph


def node_graph() -> dict[str, set[str]]:
    """The modules of src/ros/node/ -> the ones each names as `super::<module>`."""
    files = sorted((SRC / "ros" / "node").glob("*.rs"))
    names = {f.stem for f in files} - {"mod"}
    return {f.stem: set(re.findall(r"\bsuper::(\w+)", code(f))) & names - {f.stem}
            for f in files if f.stem != "mod"}


def test_no_import_cycle_between_the_library_folders_nor_the_nodes_modules() -> None:
    # The detector finds a cycle where there is one (handoff/ and backend/ imported each
    # other until the consumer moved above both; shared.rs, former.rs and input.rs did).
    assert cycles({"handoff": {"backend"}, "backend": {"handoff", "image"}, "image": set()}) == \
        [["backend", "handoff", "backend"]]
    lib, node = library_graph(), node_graph()
    assert {"backend", "handoff", "consumer", "pipeline", "ros"} <= set(lib) and lib["consumer"], lib
    assert {"shared", "former", "input", "spin"} <= set(node) and node["spin"], node
    assert cycles(lib) == [], cycles(lib)
    assert cycles(node) == [], cycles(node)
