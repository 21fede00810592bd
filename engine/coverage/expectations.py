"""The checked-in expectations file: op key -> expected engine status (plus reasoned xfails).

Shape: {"ops": {"<op>": "<status>"}, "xfail": {"<op>": "<why the mismatch is accepted>"}}. A test
fails when an op's status differs from the file in either direction, so a regression and an
unrecorded improvement both show up; `vmapbench coverage --update-expectations` rewrites "ops"
(it runs under PINNED, the settings tests/test_opinfo.py uses).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from engine.coverage.harness import OpResult

EXPECTATIONS = Path(__file__).resolve().parents[2] / "tests" / "opinfo_expectations.json"
# The harness settings the file is pinned under: a fixed number of samples, not a time box, so a
# slower machine checks the same cases (every pattern of each) and gets the same statuses.
PINNED = {"samples": 4, "time_box": None}


def load(path: Path = EXPECTATIONS) -> dict:
    if not path.exists():
        return {"ops": {}, "xfail": {}}
    data = json.loads(path.read_text())
    data.setdefault("ops", {})
    data.setdefault("xfail", {})
    return data


def update(results: Sequence[OpResult], path: Path = EXPECTATIONS) -> dict:
    """Merge `results` into the file (ops not run keep their entry); xfail reasons are kept."""
    data = load(path)
    for r in results:
        data["ops"][r.op] = r.engine
    data["ops"] = dict(sorted(data["ops"].items()))
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data
