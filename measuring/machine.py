"""The machine a measurement ran on: its CPU and GPU models and its name (`machine_name`), under
which results are stored (`results/<machine>/`) and noise floors are looked up (measuring.stats)."""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path

MACHINE_ENV = "VMAPBENCH_MACHINE"


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bcpu\b|\bprocessor\b|@.*$", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def gpu_model() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine_name() -> str:
    """VMAPBENCH_MACHINE, else '<cpu model>-<n>cpu[-<gpu model>]', e.g. 'amd-epyc-2cpu'.

    Derived from the hardware rather than the hostname, which containers and CI runners randomize:
    the name must stay the same from run to run for results to form a history.
    Under the CUDA stand-in (a dry run of `.ci/gpu-check`) the name ends in 'cuda-standin-dry-run',
    and an explicit name must say 'dry-run': its figures are CPU figures and must never pass for CUDA.
    """
    from measuring import cuda_fork

    dry_run = cuda_fork.standin_requested()
    explicit = os.environ.get(MACHINE_ENV, "").strip()
    if explicit:
        if not re.fullmatch(r"[\w.-]+", explicit):
            raise SystemExit(f"bench: {MACHINE_ENV}={explicit!r} may only hold letters, digits, '.', '_' and '-'")
        if dry_run and "dry-run" not in explicit:
            raise SystemExit(f"bench: {MACHINE_ENV}={explicit!r} under the CUDA stand-in ({cuda_fork.STANDIN_ENV}=1): "
                             "the name must contain 'dry-run' (its figures are not CUDA figures)")
        return explicit
    name = f"{_slug(cpu_model()) or 'cpu'}-{os.cpu_count() or 1}cpu"
    if dry_run:
        return f"{name}-{cuda_fork.STANDIN_MACHINE_SUFFIX}"
    gpu = gpu_model()
    return f"{name}-{_slug(gpu.replace('NVIDIA', ''))}" if gpu else name
