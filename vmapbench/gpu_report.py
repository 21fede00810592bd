"""The results page of one GPU run, written from what the run left in the results folder.

    python -m vmapbench.gpu_report MACHINE [--results DIR] [--out FILE]

Reads DIR/<machine>/machine.json (device, driver, Python, torch and where they differ from the
pins: vmapbench.bench.software_facts), the ASV result files of the machine (per commit: values
measured and failed), DIR/peer_ratios/<machine>/ (the default path against torch.func and jax.jit,
with the tier it ran and each skipped or failed method's reason), the machine's newest
DIR/time_to_n/<machine>/ file (with its first calls' imports) and DIR/profiles/<machine>-*/.
Writes Markdown (default DIR/<machine>/gpu-run.md); `.ci/gpu-check all` runs it last.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from measuring import stats


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1e3:.3g}"


def _ratio(row: dict[str, Any], top: str | None, bottom: str | None) -> str:
    samples = row.get("samples", {})
    if top not in samples or bottom not in samples:
        return "-"
    ratios = [a / b for a, b in zip(samples[top], samples[bottom])]
    return f"{stats.median(ratios):.2f}" if ratios else "-"


def asv_section(results: Path, machine: str) -> list[str]:
    """Per commit and environment of the machine: values measured and the failed points."""
    from vmapbench.bench import run_outcome

    lines = ["## ASV results", "", "| commit | environment | values | failed |", "| --- | --- | --- | --- |"]
    failed_points: list[str] = []
    seen = set()
    for path in sorted((results / machine).glob("*-*.json")):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text())
        commit, env = data.get("commit_hash", ""), data.get("env_name", "")
        if (commit, env) in seen:
            continue
        seen.add((commit, env))
        prefix = env.split("-", 1)[0]
        measured, failed = run_outcome(results, machine, commit, 0, [], prefix)
        failed_points += failed
        lines.append(f"| {commit[:8]} | {env} | {measured} | {len(failed)} |")
    if not seen:
        lines.append("| (no result files) | | | |")
    if failed_points:
        lines += ["", "Failed points:", "", *(f"- `{p}`" for p in failed_points)]
    return lines + [""]


def peers_section(results: Path, machine: str) -> list[str]:
    """The newest peer_ratios report of the machine as a table, with the skipped and failed methods."""
    reports = sorted((results / "peer_ratios" / machine).glob("*.json"), key=lambda p: p.stat().st_mtime)
    if not reports:
        return ["## The default path against torch.func and jax.jit", "", "No peer_ratios report.", ""]
    doc = json.loads(reports[-1].read_text())
    lines = ["## The default path against torch.func and jax.jit", "",
             f"`python -m vmapbench.peer_ratios --device {doc.get('device')} --ours default` at commit "
             f"{str(doc.get('commit'))[:8]} ({reports[-1].name}). Milliseconds per call, medians over "
             "interleaved rounds; ratios are medians of the per-round ratios; tier: what ours' settled call ran.", "",
             "| workload | size | ours | tier | ours ms | torch.func ms | jax ms | ours / jax.jit | ours / torch.func |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for row in doc.get("rows", []):
        sec = row.get("seconds", {})
        ours = row.get("ours")
        tier = row.get("tier") or row.get("fused_state") or "-"
        if row.get("fused_state") not in (None, row.get("tier")) and row.get("tier") \
                and not str(row["fused_state"]).startswith("eager"):
            tier = f"{row['tier']} ({row['fused_state']})"
        elif str(row.get("fused_state", "")).startswith("eager"):
            tier = row["fused_state"]
        lines.append(f"| {row['workload']} | {row['size']} | {ours} | {tier} | {_ms(sec.get(ours))} "
                     f"| {_ms(sec.get('torch_func'))} | {_ms(sec.get('jax'))} | {_ratio(row, ours, 'jax')} "
                     f"| {_ratio(row, ours, 'torch_func')} |")
        notes += [f"- {row['workload']} {m} skipped: {why}" for m, why in row.get("skipped", {}).items()]
        notes += [f"- {row['workload']} {m} FAILED: {why}" for m, why in row.get("failed", {}).items()]
    return lines + ([""] + notes if notes else []) + [""]


def skipped_section(device: str) -> list[str]:
    """The peer methods this environment cannot run on `device`, with the reason each names (asv
    records a skipped point as n/a, without its reason): what the run's skips were."""
    from vmapbench.peer_ratios import jax_unavailable
    from workloads.base import PEER_METHODS
    from workloads.peers import PeerUnavailable, check_available

    lines = [f"## Methods skipped on {device} in this environment", ""]
    for method in sorted(PEER_METHODS):
        try:
            check_available(method)
        except PeerUnavailable as exc:
            lines.append(f"- {method}: {exc}")
    reason = jax_unavailable(device)
    if reason is not None:
        lines.append(f"- jax: {reason}")
    return lines + (["None: every peer method could run."] if len(lines) == 2 else []) + [""]


def time_to_n_section(results: Path, machine: str) -> list[str]:
    """The machine's newest time-to-N file: seconds from the first call per curve and N, and each
    of the first calls' own seconds with what it imported (`vmapbench time-to-n --first-calls`)."""
    from workloads import time_to_n

    lines = ["## Time to N from the first call", ""]
    files = [p for p in time_to_n.newest(results) if p.parent.name == machine]
    if not files:
        return lines + ["No time-to-N results.", ""]
    doc, curves = time_to_n.load(files[0])
    ns = doc["ns"]
    lines += [f"`{files[0].relative_to(results)}` ({doc['device']}, {doc['threads']} thread(s), "
              f"{doc['max_seconds']:g} s of calls per curve).", "",
              "| workload | curve | status | " + " | ".join(f"N={n}" for n in ns) + " |",
              "| --- | --- | --- | " + " | ".join("---" for _ in ns) + " |"]
    for c in curves:
        cells = ["-" if c.at(n) is None else f"{c.at(n):.3g}" for n in ns]
        lines.append(f"| {c.workload} | {c.label} | {c.status} | " + " | ".join(cells) + " |")
    calls = [c for c in curves if c.first_calls]
    if calls:
        lines += ["", "Each of the first calls (its own seconds; the packages it imported):", ""]
        for c in calls:
            lines.append(f"- {c.workload} {c.label}: " + "; ".join(time_to_n.describe_call(k, 8) for k in c.first_calls))
    return lines + [""]


def profiles_section(results: Path, machine: str) -> list[str]:
    lines = ["## Profiles", ""]
    found = sorted((results / "profiles").glob(f"{machine}-*"))
    for folder in found:
        summary = folder / "summary.json"
        busy = ""
        if summary.is_file():
            nvml = json.loads(summary.read_text()).get("nvml") or {}
            mean = nvml.get("mean_gpu_util")
            if isinstance(mean, (int, float)) and math.isfinite(mean):
                busy = f": GPU busy {mean:.1f}% of the time on average (NVML)"
        files = ", ".join(sorted(p.name for p in folder.iterdir() if p.is_file()))
        lines.append(f"- `profiles/{folder.name}/`{busy} ({files})")
    return lines + (["No profile."] if not found else []) + [""]


def report(results: Path, machine: str, env_check: bool = True) -> str:
    """The page's Markdown; `env_check` adds the peer methods this environment cannot run on cuda
    (run it where the results were measured)."""
    facts_path = results / machine / "machine.json"
    if not facts_path.is_file():
        raise SystemExit(f"gpu_report: {facts_path} does not exist: run `.ci/gpu-check all` (or `make bench`) "
                         "for this machine first, or name a machine that has results under {results}")
    facts = json.loads(facts_path.read_text())
    cpu = str(facts.get("cpu", ""))
    device = cpu.split("; GPU ", 1)[1] if "; GPU " in cpu else "(no GPU recorded)"
    lines = [f"# GPU run: {machine}", ""]
    if facts.get("dry_run"):
        lines += [f"**DRY RUN: {facts['dry_run']}.**", ""]
    lines += ["Generated by `python -m vmapbench.gpu_report` from this run's files; nothing edited by hand.", "",
              "| | |", "| --- | --- |",
              f"| device | {device} |",
              f"| driver | {facts.get('driver', '(not recorded)')} |",
              f"| Python | {facts.get('python', '(not recorded)')} |",
              f"| torch | {facts.get('torch', '(not recorded)')} |",
              f"| pins | {facts.get('pins', 'as pinned (asv.conf.json)')} |",
              f"| host | {cpu.split('; GPU ', 1)[0]}, {facts.get('ram', '?')} RAM, {facts.get('os', '?')} |", ""]
    lines += (asv_section(results, machine) + peers_section(results, machine) + time_to_n_section(results, machine)
              + profiles_section(results, machine))
    if env_check:
        lines += skipped_section(device="cuda")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from vmapbench.bench import results_dir

    parser = argparse.ArgumentParser(prog="python -m vmapbench.gpu_report", description=__doc__.splitlines()[0])
    parser.add_argument("machine", help="the machine name (a folder of the results)")
    parser.add_argument("--results", type=Path, default=None, help="results folder (default: results/ or $VMAPBENCH_RESULTS_DIR)")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default RESULTS/<machine>/gpu-run.md)")
    parser.add_argument("--no-env-check", action="store_true",
                        help="leave out which peer methods this environment cannot run (not the machine measured)")
    args = parser.parse_args(argv)
    results = args.results or results_dir()
    out = args.out or results / args.machine / "gpu-run.md"
    out.write_text(report(results, args.machine, env_check=not args.no_env_check) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
