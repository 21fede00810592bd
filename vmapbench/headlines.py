"""The headline results, the runs README.md's tables show: measured anew at HEAD, then rendered.

    python -m vmapbench.headlines                  # every headline run at HEAD; repoint the tables; render
    python -m vmapbench.headlines --only peer_ratios
    python -m vmapbench.headlines -w psg_mlp -w nn_lstm --results-dir /tmp/trial  # a trial: pages untouched
    python -m vmapbench.headlines --check          # name each headline too many engine commits behind HEAD

A headline is a table of README.md whose source lies under one of RUNS' folders. Each run repeats
the settings of the file the README shows now (thread count, N, budget), so one headline file
differs from the last in the code measured, not in how. After a full run the markers of README.md
and docs/ that named the old file name the new one, and `vmapbench.docs_tables` renders every
table. `--check` (and tests/test_docs_headlines.py) counts the commits touching engine/ between a
headline's commit and HEAD (but for engine/coverage/, the conformance checker, which no headline
runs): more than MAX_ENGINE_COMMITS and the headline is stale.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vmapbench import docs_tables

ROOT = docs_tables.ROOT
# How far behind the engine a headline may be: a few commits, so that a change under engine/ can
# land and its headline follow in the next commits, never hundreds of commits later.
MAX_ENGINE_COMMITS = 3
ENGINE = "engine/"
# The engine's code the headlines measure: engine/ but for its conformance checker (engine.coverage,
# run by `vmapbench coverage` and the tests, never on a timed path).
MEASURED = (ENGINE, ":(exclude)engine/coverage/")


@dataclass(frozen=True)
class Run:
    """How one kind of headline result is measured: `argv(settings, workloads)` is the command
    (workloads empty: every one), `settings(doc)` what it repeats of the current file."""

    folder: str  # under results/
    settings: Callable[[dict[str, Any]], list[str]]
    argv: Callable[[list[str], list[str]], list[str]]


def _time_to_n_settings(doc: dict[str, Any]) -> list[str]:
    return ["--threads", str(doc.get("threads", 1)), "--max-seconds", f"{doc['max_seconds']:g}",
            "--n", ",".join(str(n) for n in doc["ns"])]


def _time_to_n_argv(settings: list[str], workloads: list[str]) -> list[str]:
    return [sys.executable, "-m", "vmapbench", "time-to-n", *(workloads or ["--all"]), "--write", *settings]


def _peers_settings(doc: dict[str, Any]) -> list[str]:
    # Ours is the default path (`engine`) where the shown run measured it, else the explicit trace.
    default_path = any(row.get("ours") == "engine" for row in doc.get("rows", []))
    return ["--threads", str(doc.get("threads", 1)), "--ours", "default" if default_path else "traced"]


def _peers_argv(settings: list[str], workloads: list[str]) -> list[str]:
    return [sys.executable, "-m", "vmapbench.peer_ratios", "--write", *settings,
            *[arg for w in workloads for arg in ("-w", w)]]


RUNS: dict[str, Run] = {
    "time_to_n": Run("time_to_n", _time_to_n_settings, _time_to_n_argv),
    "peer_ratios": Run("peer_ratios", _peers_settings, _peers_argv),
}


def headlines(root: Path = ROOT) -> dict[str, str]:
    """RUNS key -> the results file (relative to `root`) README.md's tables show for it."""
    out: dict[str, str] = {}
    for m in docs_tables.tables((root / "README.md").read_text()):
        parts = Path(m["source"]).parts
        if len(parts) > 1 and parts[0] == "results" and parts[1] in RUNS:
            shown = out.setdefault(parts[1], m["source"])
            if shown != m["source"]:
                raise ValueError(f"README.md shows two {parts[1]} files, {shown} and {m['source']}: "
                                 "one headline run per kind")
    return out


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def history_unavailable(root: Path = ROOT) -> str | None:
    """Why engine commits cannot be counted here (no git, not a repository, a shallow clone), or None."""
    try:
        done = git(root, "rev-parse", "--is-shallow-repository")
    except FileNotFoundError:
        return "git is not installed"
    if done.returncode != 0:
        return f"{root} is not a git repository ({done.stderr.strip()})"
    if done.stdout.strip() == "true":
        return "this is a shallow clone: the commits between a result and HEAD are not all here (git fetch --unshallow)"
    return None


def engine_commits_behind(commit: str, root: Path = ROOT) -> int:
    """How many commits touching engine/ lie between `commit` and HEAD; ValueError naming the
    commit when this history does not hold it."""
    if git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise ValueError(f"commit {commit[:8]} is not in this repository's history")
    done = git(root, "rev-list", "--count", f"{commit}..HEAD", "--", *MEASURED)
    if done.returncode != 0:
        raise ValueError(f"git rev-list {commit[:8]}..HEAD failed: {done.stderr.strip()}")
    return int(done.stdout)


def stale(root: Path = ROOT, allowed: int = MAX_ENGINE_COMMITS) -> list[str]:
    """One line per headline whose run is more than `allowed` engine commits behind HEAD."""
    out = []
    for kind, source in headlines(root).items():
        commit = json.loads((root / source).read_text())["commit"]
        try:
            behind = engine_commits_behind(commit, root)
        except ValueError as exc:
            out.append(f"{kind} headline {source}: {exc}")
            continue
        if behind > allowed:
            out.append(f"{kind} headline {source} was measured at {commit[:8]}, {behind} commits under "
                       f"{ENGINE} behind HEAD (at most {allowed}): run `make headlines`")
    return out


def repoint(old: str, new: str, root: Path = ROOT) -> list[Path]:
    """Every table marker of README.md and docs/ (not the dated lab notes) naming `old` names
    `new` instead; the pages changed."""
    changed = []
    for page in docs_tables.pages(root):
        if "lab" in page.relative_to(root).parts:
            continue
        text = page.read_text()
        fresh = text
        for m in reversed(docs_tables.tables(text)):
            if m["source"] == old:
                fresh = fresh[:m.start("source")] + new + fresh[m.end("source"):]
        if fresh != text:
            page.write_text(fresh)
            changed.append(page)
    return changed


def head_commit(root: Path = ROOT) -> str:
    done = git(root, "rev-parse", "HEAD")
    if done.returncode != 0:
        raise SystemExit(f"headlines: git rev-parse HEAD failed in {root}: {done.stderr.strip()}")
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vmapbench.headlines", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only name the headlines more than --allowed engine commits behind HEAD (exit 1 if any)")
    parser.add_argument("--allowed", type=int, default=MAX_ENGINE_COMMITS,
                        help=f"with --check: engine commits a headline may lag (default {MAX_ENGINE_COMMITS})")
    parser.add_argument("--only", action="append", choices=sorted(RUNS), help="only this run (repeatable)")
    parser.add_argument("-w", "--workload", action="append", default=[], dest="workloads",
                        help="a trial on these workloads only (repeatable): needs --results-dir; no page changes")
    parser.add_argument("--results-dir", type=Path,
                        help="write the results under this folder (VMAPBENCH_RESULTS_DIR) and print the tables "
                             "instead of repointing the pages")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="measure although engine/ has uncommitted changes (the files would name HEAD)")
    args = parser.parse_args(argv)
    if args.check:
        reason = history_unavailable()
        if reason:
            print(f"headlines: cannot count engine commits: {reason}")
            return 2
        found = stale(allowed=args.allowed)
        for line in found:
            print(f"stale: {line}")
        return 1 if found else 0
    if args.workloads and args.results_dir is None:
        raise SystemExit("headlines: a run on some workloads (-w) is a trial: pass --results-dir DIR, so that "
                         "the committed headline files are not replaced by a partial run")
    dirty = git(ROOT, "status", "--porcelain", "--", *MEASURED).stdout.strip()
    if dirty and not args.allow_dirty:
        raise SystemExit(f"headlines: {ENGINE} has uncommitted changes; the results would be labelled with HEAD "
                         f"but measure other code. Commit them (or pass --allow-dirty):\n{dirty}")
    shown = headlines()
    chosen = args.only or list(RUNS)
    missing = [k for k in chosen if k not in shown]
    if missing:
        raise SystemExit(f"headlines: README.md shows no {', '.join(missing)} table to regenerate")
    env = dict(os.environ)
    results = (args.results_dir.resolve() if args.results_dir else ROOT / "results")
    if args.results_dir:
        env["VMAPBENCH_RESULTS_DIR"] = str(results)
    from vmapbench.bench import machine_name

    commit, machine = head_commit(), machine_name()
    failures, written = [], {}
    for kind in chosen:
        run = RUNS[kind]
        old = shown[kind]
        cmd = run.argv(run.settings(json.loads((ROOT / old).read_text())), args.workloads)
        print(f"headlines: {kind} at {commit[:8]} on {machine}: {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        print(f"headlines: {kind} took {(time.monotonic() - started) / 60:.1f} min (exit {rc})", flush=True)
        path = results / run.folder / machine / f"{commit[:8]}.json"
        if not path.is_file():
            raise SystemExit(f"headlines: {kind} wrote no {path} (exit {rc}); see its output above")
        if rc != 0:
            failures.append(f"{kind} exited {rc}: a method failed or a curve was killed (see above); "
                            f"its table shows '-' there")
        written[kind] = (old, path)
    if args.results_dir:
        for kind, (old, path) in written.items():
            for m in docs_tables.tables((ROOT / "README.md").read_text()):
                if m["source"] == old:
                    print(f"\n<!-- table: {m['kind']} {path} -->\n{docs_tables.KINDS[m['kind']](path)}")
    else:
        for kind, (old, path) in written.items():
            new = str(path.relative_to(ROOT))
            for page in repoint(old, new):
                print(f"headlines: {page.relative_to(ROOT)} now shows {new}")
        docs_tables.main([])
    for line in failures:
        print(f"headlines: {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
