"""The checked-in expectations file: op key -> expected engine status (plus reasoned xfails).

Shape: {"ops": {"<op>": "<status>"}, "xfail": {"<op>": "<why the mismatch is accepted>"},
"op_db_releases": {"<op>": "<releases>"}}. "ops" covers every supported torch release; an op that
torch's OpInfo database has in some of them only names those in "op_db_releases" ("2.14-": from
2.14 on, "-2.13": up to 2.13; see `in_op_db`). A test
fails when an op's status differs from the file in either direction, so a regression and an
unrecorded improvement both show up; `vmapbench coverage --update-expectations` rewrites "ops"
(it runs under PINNED, the settings tests/test_opinfo.py uses).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from engine._compat import TORCH_VERSION
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
    data.setdefault("op_db_releases", {})
    return data


def _release(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def in_op_db(op: str, data: dict, version: tuple[int, int] = TORCH_VERSION) -> bool:
    """Whether torch `version`'s OpInfo database has `op`, by the file's "op_db_releases"."""
    releases = data.get("op_db_releases", {}).get(op)
    if releases is None:
        return True
    first, sep, last = releases.partition("-")
    if not sep:
        raise ValueError(f"tests/opinfo_expectations.json: op_db_releases[{op!r}] is {releases!r}; "
                         f"write 'X.Y-' (from X.Y on), '-X.Y' (up to X.Y) or 'X.Y-X.Z'")
    return (not first or _release(first) <= version) and (not last or version <= _release(last))


def update(results: Sequence[OpResult], path: Path = EXPECTATIONS) -> dict:
    """Merge `results` into the file (ops not run keep their entry); xfail reasons are kept."""
    data = load(path)
    for r in results:
        data["ops"][r.op] = r.engine
    data["ops"] = dict(sorted(data["ops"].items()))
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data
