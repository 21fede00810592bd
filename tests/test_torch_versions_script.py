""".ci/torch-versions with `make` and the environments' python stood in for: what it hands to make
for each release (`make bench TORCH=...` runs it with GOAL=bench)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Records each call (the commit it was given, then its arguments); the first bench call commits,
# as another session sharing the checkout may do while the releases run.
FAKE_MAKE = """#!/bin/sh
echo "${VMAPBENCH_COMMIT:-none} $*" >> "$CALLS"
case " $* " in
  *" bench "*) [ -e "$CALLS.moved" ] || { touch "$CALLS.moved"; git commit -q --allow-empty -m moved; } ;;
esac
"""


def _clone(tmp_path: Path, versions: tuple[str, ...]) -> tuple[Path, dict[str, str]]:
    repo = tmp_path / "clone"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "torch-versions", repo / ".ci" / "torch-versions")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:1], "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], cwd=repo, check=True)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "make").write_text(FAKE_MAKE)
    (tools / "make").chmod(0o755)
    cache = tmp_path / "cache"
    for v in versions:  # each release's environment, its python answering with its version
        python = cache / "vmapbench-venvs" / f"torch-{v}" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(f"#!/bin/sh\necho {v}\n")
        python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "VMAPBENCH_COMMIT")}
    env.update(PATH=f"{tools}:{env['PATH']}", XDG_CACHE_HOME=str(cache), CALLS=str(tmp_path / "calls"),
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return repo, env


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_every_release_benches_the_commit_head_was_at_the_start(tmp_path: Path) -> None:
    repo, env = _clone(tmp_path, ("2.13.0", "2.15.0"))
    start = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    # No HOME, as on a runner that starts the script without one.
    run = subprocess.run(["bash", ".ci/torch-versions", "2.13.0", "2.15.0"], cwd=repo, env={**env, "GOAL": "bench"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    benches = [line.split() for line in (tmp_path / "calls").read_text().splitlines() if " bench " in f" {line} "]
    assert len(benches) == 2
    assert {b[0] for b in benches} == {start}  # HEAD moved after the first release; both got the start
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip() != start


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_tests_get_no_pinned_commit(tmp_path: Path) -> None:
    repo, env = _clone(tmp_path, ("2.15.0",))
    run = subprocess.run(["bash", ".ci/torch-versions"], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["none", "none"]  # make peers, then make test
    assert " test " in f" {calls[-1]} " and "TORCH_PIN=torch==2.15.0" in calls[-1]
