"""The README stays true to the code: its parameter table lists exactly the node's
parameters (the fields of Config, as the CLI prints the resolved configuration, and
use_sim_time). test/ros/test_citizen.py ties its ranges and read-only marks to the node's
parameter descriptors."""

import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "target" / "release" / "vision_preproc"


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def readme_parameters() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Parameters", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([a-z_.]+)` \|", section, flags=re.M)


def test_readme_parameter_table_matches_config() -> None:
    out = subprocess.run([str(CLI), "check-config", str(ROOT / "config" / "default.yaml")],
                         capture_output=True, text=True, check=True).stdout
    # The fields of Config, and use_sim_time: the node's one parameter that is not a field
    # (its clock; src/ros/node/params/mod.rs USE_SIM_TIME).
    code = list(flatten(yaml.safe_load(out))) + ["use_sim_time"]
    documented = readme_parameters()
    assert len(documented) == len(set(documented)), "duplicate rows in the README table"
    assert sorted(documented) == sorted(code), (
        f"README only: {sorted(set(documented) - set(code))}; code only: {sorted(set(code) - set(documented))}"
    )


# Links and evidence: every relative link of the documents resolves; every run output in
# docs/evidence/ is listed in its index and cited by a document, and every docs/evidence/
# path a document or script names exists.

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EVIDENCE = ROOT / "docs" / "evidence"


def expand(name: str) -> list[str]:
    """Shell-style brace expansion: `run{1,2}.log` -> run1.log, run2.log."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",") for x in expand(name[:m.start()] + alt + name[m.end():])]


def test_relative_links_of_the_documents_resolve() -> None:
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (doc.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_evidence_index_lists_exactly_the_files() -> None:
    index = (EVIDENCE / "README.md").read_text()
    listed = {n for row in re.findall(r"^\| (.*?) \|", index, flags=re.M)
              for token in re.findall(r"`([^`]+)`", row) for n in expand(token)}
    files = {p.name for p in EVIDENCE.iterdir() if p.name != "README.md"}
    assert listed == files, f"not listed: {sorted(files - listed)}; listed, no file: {sorted(listed - files)}"


def test_every_evidence_file_is_cited_and_every_citation_exists() -> None:
    cited, missing = set(), []
    sources = [*DOCS, *sorted((ROOT / "bench").rglob("*.py")), *sorted((ROOT / "bench").rglob("*.sh")),
               *sorted(p for p in (ROOT / "scripts").rglob("*") if p.is_file() and "__pycache__" not in p.parts)]
    for src in sources:
        for token in re.findall(r"docs/evidence/([A-Za-z0-9_.,{}-]+)", src.read_text()):
            for name in expand(token.rstrip(".,")):
                if (EVIDENCE / name).is_file():
                    cited.add(name)
                elif name and name != "README.md":
                    missing.append(f"{src.relative_to(ROOT)}: docs/evidence/{name}")
    assert not missing, missing
    files = {p.name for p in EVIDENCE.iterdir() if p.name != "README.md"}
    assert files <= cited, f"in docs/evidence/ but cited by no document: {sorted(files - cited)}"
