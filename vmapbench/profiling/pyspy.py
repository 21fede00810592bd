"""Driving py-spy: find it, attach it to the child, explain its failures, read its speedscope file.

py-spy is attached to the already-running child (`record --pid`) rather than launching it, so the
samples cover the measured loop only, not `import torch` or a torch.compile. Attaching needs
ptrace rights over the child; `permission_hint` says how to get them.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

INSTALL_HINT = (
    "install it into the environment that runs vmapbench: `.venv/bin/pip install py-spy` "
    "(or `pip install py-spy`), or pass its location with --py-spy PATH; "
    "--tool torch profiles without it"
)
# What py-spy (and the kernel, through it) prints when ptrace is refused.
_PERMISSION_WORDS = ("permission denied", "operation not permitted", "os error 1)", "os error 13)",
                     "elevated permissions", "ptrace")


class PySpyError(RuntimeError):
    """py-spy is missing, not permitted to attach, or failed; the message says what to do."""


def find(explicit: str | None = None) -> str:
    """The py-spy executable: --py-spy, then next to this Python (a venv's bin/), then PATH."""
    if explicit:
        path = shutil.which(explicit) or (explicit if os.access(explicit, os.X_OK) else None)
        if path is None:
            raise PySpyError(f"py-spy not found at {explicit!r} (--py-spy); {INSTALL_HINT}")
        return path
    beside = Path(sys.executable).parent / "py-spy"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise PySpyError(f"py-spy is not installed (not next to {sys.executable} nor on PATH); {INSTALL_HINT}")
    return found


def version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        raise PySpyError(f"cannot run {exe!r}: {exc}; {INSTALL_HINT}") from None
    return out.stdout.strip().removeprefix("py-spy ").strip() or "unknown"


def record_command(exe: str, pid: int, output: Path, *, seconds: float, rate: int,
                   native: bool) -> list[str]:
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
           "--rate", str(rate), "--format", "speedscope", "--output", str(output)]
    return cmd + (["--native"] if native else [])


def ptrace_scope() -> str | None:
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return None


def is_permission_error(stderr: str) -> bool:
    text = stderr.lower()
    return any(word in text for word in _PERMISSION_WORDS)


def permission_hint() -> str:
    scope = ptrace_scope()
    yama = (f"/proc/sys/kernel/yama/ptrace_scope is {scope}; `echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope` "
            "lets a user trace their own processes" if scope not in (None, "0")
            else "if Yama is enabled, /proc/sys/kernel/yama/ptrace_scope must be 0 (or run as root)")
    return ("py-spy was not permitted to attach to the profiled process (ptrace denied). Fixes: "
            "run as root (`sudo env \"PATH=$PATH\" make profile ...`); in Docker start the container with "
            f"`--cap-add SYS_PTRACE`; {yama}; or profile without py-spy: --tool torch")


def explain_failure(returncode: int, stderr: str, native: bool) -> str:
    tail = "\n".join(stderr.strip().splitlines()[-5:])
    if is_permission_error(stderr):
        return f"{permission_hint()}\npy-spy said: {tail}"
    extra = " (--native unwinding failed; it needs a Linux/Windows x86_64 build of py-spy, try without --native)" if native else ""
    return f"py-spy record exited with status {returncode}{extra}: {tail or '(no output)'}"


def short_path(file: str) -> str:
    """Paths as a reader knows them: 'torch/autograd/__init__.py', 'engine/_vmap.py'."""
    if "site-packages/" in file:
        return file.rsplit("site-packages/", 1)[1]
    for root in (os.getcwd(), str(Path(__file__).resolve().parents[2])):
        if file.startswith(root + os.sep):
            return file[len(root) + 1:]
    return file


def frame_label(frame: dict[str, Any]) -> str:
    """'name (file:line)', or just the name for native frames without a line."""
    name, file, line = frame.get("name", "?"), short_path(frame.get("file") or ""), frame.get("line")
    if not file:
        return name
    return f"{name} ({file}:{line})" if line else f"{name} ({file})"


def read_stacks(path: Path) -> Counter[tuple[str, ...]]:
    """Collapsed stacks (root first) -> samples, over every thread of a py-spy speedscope file."""
    doc = json.loads(Path(path).read_text())
    labels = [frame_label(f) for f in doc["shared"]["frames"]]
    stacks: Counter[tuple[str, ...]] = Counter()
    for profile in doc.get("profiles", []):
        samples = profile.get("samples", [])
        weights = profile.get("weights") or [1] * len(samples)
        step = min(weights) if weights and min(weights) > 0 else 1
        for stack, weight in zip(samples, weights):
            # py-spy writes seconds per sample as the weight; count samples, not seconds.
            stacks[tuple(labels[i] for i in stack)] += max(1, round(weight / step))
    return stacks


def top_self(stacks: Counter[tuple[str, ...]], n: int = 10) -> list[dict[str, Any]]:
    """Functions where the samples landed (leaf frames, lines merged), most first."""
    total = sum(stacks.values())
    by_function: Counter[str] = Counter()
    for stack, count in stacks.items():
        if stack:
            leaf = stack[-1]
            name, _, where = leaf.partition(" (")
            file, _, line = where.removesuffix(")").rpartition(":")
            if not line.isdigit():
                file = where.removesuffix(")")
            by_function[f"{name} ({file})" if file else name] += count
    return [{"function": f, "samples": c, "percent": 100.0 * c / total if total else 0.0}
            for f, c in by_function.most_common(n)]
