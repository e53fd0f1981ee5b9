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
    # (its clock; src/ros/node/params.rs USE_SIM_TIME).
    code = list(flatten(yaml.safe_load(out))) + ["use_sim_time"]
    documented = readme_parameters()
    assert len(documented) == len(set(documented)), "duplicate rows in the README table"
    assert sorted(documented) == sorted(code), (
        f"README only: {sorted(set(documented) - set(code))}; code only: {sorted(set(code) - set(documented))}"
    )
