"""The README's headlines: like compared with like, and measured at most a few engine commits ago.

A headline is a README table whose source is a run of vmapbench.headlines.RUNS (time to N, peer
ratios). The time-to-N headline compares the default path with jax.jit and never an explicit
compile; the explicit compiles have their own table. Each run is at most
headlines.MAX_ENGINE_COMMITS commits under engine/ (but its conformance checker) behind HEAD, counted
with git."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vmapbench import docs_tables, headlines
from workloads import time_to_n as ttn

ROOT = docs_tables.ROOT


def test_every_headline_is_measured_within_a_few_engine_commits_of_head() -> None:
    reason = headlines.history_unavailable(ROOT)
    if reason:
        pytest.skip(f"cannot count the engine commits behind a headline: {reason}")
    assert headlines.headlines(ROOT), "README.md shows no headline run"
    stale = headlines.stale(ROOT)
    assert not stale, ("headline results older than the engine they describe (regenerate: `make headlines`, "
                       "then commit results/ and the pages):\n" + "\n".join(stale))


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(root: Path, path: str, text: str) -> str:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)
    _git(root, "add", path)
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", path)
    return _git(root, "rev-parse", "HEAD")


def test_stale_counts_only_commits_under_engine_and_names_the_headline(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    measured = _commit(tmp_path, "engine/a.py", "x = 1\n")
    source = f"results/peer_ratios/box/{measured[:8]}.json"
    (tmp_path / source).parent.mkdir(parents=True)
    (tmp_path / source).write_text(json.dumps({"commit": measured}))
    (tmp_path / "README.md").write_text(f"<!-- table: peers-headline {source} -->\n<!-- /table -->\n")
    for i in range(3):
        _commit(tmp_path, "docs/page.md", f"{i}\n")  # not engine commits
    _commit(tmp_path, "engine/coverage/harness.py", "z = 1\n")  # the conformance checker: no headline runs it
    assert headlines.engine_commits_behind(measured, tmp_path) == 0
    _commit(tmp_path, "engine/a.py", "x = 2\n")
    _commit(tmp_path, "engine/b.py", "y = 1\n")
    assert headlines.engine_commits_behind(measured, tmp_path) == 2
    assert headlines.stale(tmp_path, allowed=2) == []
    (line,) = headlines.stale(tmp_path, allowed=1)
    assert line.startswith(f"peer_ratios headline {source}") and "2 commits under engine/" in line
    (tmp_path / source).write_text(json.dumps({"commit": "0" * 40}))
    (line,) = headlines.stale(tmp_path)
    assert "not in this repository's history" in line


def test_a_shallow_clone_is_named_as_the_reason(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "-q")
    for i in range(2):
        _commit(origin, "engine/a.py", f"x = {i}\n")
    assert headlines.history_unavailable(origin) is None
    subprocess.run(["git", "clone", "-q", "--depth", "1", origin.as_uri(), str(tmp_path / "shallow")], check=True)
    assert "shallow clone" in (headlines.history_unavailable(tmp_path / "shallow") or "")
    assert "not a git repository" in (headlines.history_unavailable(tmp_path / "none") or "")


def test_repoint_moves_every_marker_of_the_old_file_but_the_lab_notes(tmp_path: Path) -> None:
    old, new = "results/time_to_n/box/aaaaaaaa.json", "results/time_to_n/box/bbbbbbbb.json"
    marker = f"<!-- table: time-to-n-headline {old} -->\n<!-- /table -->\n"
    (tmp_path / "docs" / "lab").mkdir(parents=True)
    (tmp_path / "README.md").write_text("intro\n" + marker + "<!-- table: noise results/noise/box.json -->\n")
    (tmp_path / "docs" / "page.md").write_text("```\n" + marker + "```\n" + marker)
    (tmp_path / "docs" / "lab" / "note.md").write_text(marker)
    changed = headlines.repoint(old, new, tmp_path)
    assert sorted(p.name for p in changed) == ["README.md", "page.md"]
    assert (tmp_path / "README.md").read_text() == "intro\n" + marker.replace(old, new) + \
        "<!-- table: noise results/noise/box.json -->\n"
    assert (tmp_path / "docs" / "page.md").read_text() == "```\n" + marker + "```\n" + marker.replace(old, new)
    assert (tmp_path / "docs" / "lab" / "note.md").read_text() == marker


def _readme_source(kind: str) -> Path:
    (source,) = {m["source"] for m in docs_tables.tables((ROOT / "README.md").read_text()) if m["kind"] == kind}
    return ROOT / source


def test_the_time_to_n_headlines_keep_the_default_path_and_explicit_compiles_apart() -> None:
    source = _readme_source("time-to-n-headline")
    doc, curves = ttn.load(source)
    default = docs_tables.time_to_n_headline(source)
    compiled = docs_tables.time_to_n_compiled(source)
    explicit_only = {c.workload for c in curves} - {c.workload for c in curves if c.method == ttn.DEFAULT_PATH}
    assert explicit_only, f"{source} has no workload without a default path: nothing to keep apart"
    groups = ttn.by_workload(curves).values()
    reached = [g for g in groups if ttn.over_jax(g, doc["ns"][0], ttn.DEFAULT_PATH) is not None]
    all_row = next(line for line in default.splitlines() if line.startswith("| **all** |"))
    assert all_row.split(" | ")[1].endswith(f"({len(reached)})"), all_row
    header = next(line for line in compiled.splitlines() if line.startswith("| N |"))
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    want = [f"{ttn.curve_label(m, c)} / jax.jit" for m, c in ttn.explicit_curves(curves)]
    assert columns == want and len(columns) >= 2
    default_label = ttn.curve_label(ttn.DEFAULT_PATH, "cold")
    assert not any(col.startswith((default_label, "torch.func ", "jax.jit ")) for col in columns), columns
    rows = [line for line in compiled.splitlines() if line.startswith("| ") and not line.startswith("| N |")]
    assert [int(r.split(" | ")[0].lstrip("| ")) for r in rows[1:]] == doc["ns"]


def test_each_headline_says_what_below_one_means_and_where_it_was_measured() -> None:
    text = (ROOT / "README.md").read_text()
    shown = [m for m in docs_tables.tables(text) if m["kind"] in ("time-to-n-headline", "time-to-n-compiled",
                                                                   "peers-headline")]
    assert len(shown) == 3
    for m in shown:
        doc = json.loads((ROOT / m["source"]).read_text())
        body = m["body"]
        assert "below 1 means" in body, m["kind"]
        assert f"`{doc['machine']}`" in body and f"`{doc['commit'][:8]}`" in body, m["kind"]


def test_an_explicit_compile_a_later_file_records_gets_its_own_column(tmp_path: Path) -> None:
    """The compiled table reads the methods a file holds: a new compiler is a new column."""
    curves = [ttn.Curve("w", "s", "jax", "cold", ns=[1, 10], seconds=[1.0, 2.0]),
              ttn.Curve("w", "s", "engine_compiled", "cold", ns=[1, 10], seconds=[4.0, 4.0]),
              ttn.Curve("w", "s", "engine_xla", "cold", ns=[1, 10], seconds=[0.5, 1.0]),
              ttn.Curve("w", "s", "engine", "cold", ns=[1, 10], seconds=[0.1, 0.2])]
    doc = {"machine": "box", "commit": "c" * 40, "torch": "t", "threads": 1, "ns": [1, 10],
           "written_at": "2000-01-01T00:00:00+00:00", "curves": [c.__dict__ for c in curves]}
    source = tmp_path / "run.json"
    source.write_text(json.dumps(doc))
    table = docs_tables.time_to_n_compiled(source).splitlines()
    assert table[-4:] == ["| N | ours (engine.compile), cold cache / jax.jit | engine_xla / jax.jit |",
                          "| --- | --- | --- |", "| 1 | 4.00 (1) | 0.50 (1) |", "| 10 | 2.00 (1) | 0.50 (1) |"]


def test_the_per_workload_time_to_n_run_covers_the_registry() -> None:
    import workloads

    (source,) = {m["source"] for m in docs_tables.tables((ROOT / "docs" / "results" / "time-to-n.md").read_text())
                 if m["kind"] == "time-to-n"}
    _, curves = ttn.load(ROOT / source)
    assert {c.workload for c in curves} == {w.name for w in workloads.all_workloads()}


def test_a_regeneration_repeats_the_settings_of_the_shown_run() -> None:
    peers = headlines.RUNS["peer_ratios"]
    default_path = {"threads": 1, "rows": [{"ours": "engine"}, {"ours": "engine_compiled"}]}
    traced = {"threads": 2, "rows": [{"ours": "engine_traced"}]}
    assert peers.argv(peers.settings(default_path), ["psg_mlp"])[-6:] == \
        ["--threads", "1", "--ours", "default", "-w", "psg_mlp"]
    assert peers.settings(traced) == ["--threads", "2", "--ours", "traced"]
    ttn_run = headlines.RUNS["time_to_n"]
    argv = ttn_run.argv(ttn_run.settings({"threads": 1, "max_seconds": 15.0, "ns": [1, 30]}), [])
    assert argv[-8:] == ["--all", "--write", "--threads", "1", "--max-seconds", "15", "--n", "1,30"]
