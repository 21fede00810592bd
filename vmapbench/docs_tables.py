"""Renders every results table of README.md and docs/ from the committed files under results/.

    python -m vmapbench.docs_tables           # rewrite the tables whose data changed
    python -m vmapbench.docs_tables --check   # exit 1 naming each stale table (tests/test_docs.py)

A table sits between `<!-- table: KIND SOURCE -->` and `<!-- /table -->`; SOURCE is a results
file relative to the repository root. KINDS lists the renderers. A headline kind opens its block
with the machine, commit and date of the run and one sentence saying what its figures mean, so
the rendered page says which run it shows. Text around a table is prose and is never touched.
This is the only generator of docs tables; `python -m vmapbench.headlines` measures the headline
results anew and calls it.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from measuring import stats

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"(<!-- table: (?P<kind>[\w-]+) (?P<source>\S+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
# Fenced code blocks are left alone: a marker shown as an example is not a table.
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)


def _shown(path: Path) -> Path:
    """A results file as the pages name it: relative to the repository where it lies inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _runs_on(doc: dict[str, Any], source: Path) -> str:
    """The line above a table of recorded runs: the machine and the file."""
    return f"Runs on `{doc['machine']}`, from `{_shown(source)}`."


def _peer_rows(source: Path) -> list[Any]:
    from vmapbench.peer_ratios import Row

    fields = set(Row.__dataclass_fields__)
    return [Row(**{k: v for k, v in r.items() if k in fields}) for r in json.loads(source.read_text())["rows"]]


def peers(source: Path) -> str:
    """peer_ratios' own Markdown table of a stored run, under the line saying where it was measured."""
    from vmapbench.peer_ratios import markdown

    return measured_at(json.loads(source.read_text()), source) + "\n\n" + markdown(_peer_rows(source))


def peers_compile(source: Path) -> str:
    """peer_ratios' compile-cost table of a stored run."""
    from vmapbench.peer_ratios import compile_markdown

    return compile_markdown(_peer_rows(source))


def _date(doc: dict[str, Any]) -> str:
    written = str(doc.get("written_at") or "")
    return written[:10] if written else "an unrecorded date"


def measured_at(doc: dict[str, Any], source: Path, root: Path = ROOT) -> str:
    """The visible line above a headline table: machine, commit, date and the results file."""
    try:
        shown = source.resolve().relative_to(root.resolve())
    except ValueError:
        shown = source
    cpu = f" ({doc['cpu']}, {doc['cores']} cores)" if doc.get("cpu") and doc.get("cores") else ""
    threads = doc.get("threads")
    return (f"Measured on `{doc['machine']}`{cpu} at commit `{str(doc['commit'])[:8]}` on {_date(doc)}"
            + (f", {threads} thread{'s' if threads != 1 else ''}" if threads else "")
            + f", torch {doc['torch']}; from `{shown}`.")


def _geomean(values: list[float]) -> float:
    """stats.geomean of the values measured (NaN: not measured, left out)."""
    return stats.geomean(v for v in values if not math.isnan(v))


def peers_headline(source: Path) -> str:
    """Per workload family of the registry: geometric means of a stored run's per-workload ratios."""
    from vmapbench.peer_ratios import REFERENCE
    from workloads.base import get

    by_family: dict[str, list[Any]] = defaultdict(list)
    rows = _peer_rows(source)
    for row in rows:
        try:
            family = get(row.workload).family
        except KeyError:
            family = "(no longer in the registry)"
        by_family[family].append(row)

    def line(name: str, group: list[Any]) -> str:
        cells = [_geomean([r.ratio(r.ours, over) for r in group]) for over in (REFERENCE, "jax")]
        cells.append(_geomean([r.ratio(r.ours, r.best_peer) for r in group]))
        return f"| {name} | {len(group)} | " + " | ".join("-" if math.isnan(c) else f"{c:.2f}" for c in cells) + " |"

    doc = json.loads(source.read_text())
    lines = [measured_at(doc, source), "",
             "Each cell: the geometric mean over a family's workloads of ours' settled time per call "
             "divided by the other method's, timed in the same rounds; below 1 means ours is faster.", "",
             "| family | workloads | ours / torch.func | ours / jax.jit | ours / best peer |",
             "| --- | --- | --- | --- | --- |"]
    lines += [line(f, g) for f, g in sorted(by_family.items())]
    lines.append(line("**all**", rows))
    return "\n".join(lines)


def _families(groups: dict[tuple[str, str], list[Any]]) -> dict[str, list[list[Any]]]:
    from workloads.base import get

    by_family: dict[str, list[list[Any]]] = defaultdict(list)
    for (workload, _), group in groups.items():
        try:
            family = get(workload).family
        except KeyError:
            family = "(no longer in the registry)"
        by_family[family].append(group)
    return by_family


def _ratio_cell(ratios: list[float | None]) -> str:
    got = [r for r in ratios if r is not None]
    return f"{_geomean(got):.2f} ({len(got)})" if got else "-"


def time_to_n(source: Path) -> str:
    """A stored time-to-N run in full: how it was measured, then time_to_n.markdown's tables."""
    from workloads import time_to_n as ttn

    doc, curves = ttn.load(source)
    return f"{ttn.header(doc)} From `{_shown(source)}`." \
        f"\n\n{ttn.markdown(doc, curves)}"


def time_to_n_headline(source: Path) -> str:
    """Per workload family: geometric means of the default path's (cold cache) time to N over
    jax.jit's, counted from the first call, at each N of a stored time-to-N run. Only workloads
    with a default-path curve count (the compiled family's explicit compiles are
    time_to_n_compiled's); a workload counts at an N where both curves reached it (how many: the
    cell's second figure)."""
    from workloads import time_to_n as ttn

    doc, curves = ttn.load(source)
    ns = doc["ns"]
    groups = {k: g for k, g in ttn.by_workload(curves).items() if any(c.method == ttn.DEFAULT_PATH for c in g)}
    by_family = _families(groups)

    def line(name: str, family: list[list[Any]]) -> str:
        cells = [_ratio_cell([ttn.over_jax(g, n, ttn.DEFAULT_PATH) for g in family]) for n in ns]
        return f"| {name} | " + " | ".join(cells) + " |"

    lines = [measured_at(doc, source), "",
             "Each cell: the geometric mean over a family's workloads of the default path's time from "
             "its first call to its N-th (fresh process, cold inductor cache) divided by jax.jit's; below 1 "
             "means the default path had spent less time than jax.jit by the N-th call. In brackets: how "
             "many workloads reached N on both.", "",
             "| family | " + " | ".join(f"N={n}" for n in ns) + " |",
             "| --- | " + " | ".join("---" for _ in ns) + " |"]
    lines += [line(f, g) for f, g in sorted(by_family.items())]
    lines.append(line("**all**", list(groups.values())))
    return "\n".join(lines)


def time_to_n_compiled(source: Path) -> str:
    """The explicit compiles of a stored time-to-N run (every curve that is neither the default
    path, torch.func nor jax.jit: engine.compile, torch.compile, any compiler a later run records),
    each over jax.jit: one column per compile, one row per N, geometric means over the workloads
    that have it."""
    from workloads import time_to_n as ttn

    doc, curves = ttn.load(source)
    groups = [g for g in ttn.by_workload(curves).values() if ttn.explicit_curves(g)]
    columns = ttn.explicit_curves(c for g in groups for c in g)
    names = sorted({c.workload for g in groups for c in g})
    if not columns:
        return measured_at(doc, source) + "\n\nThis run holds no explicit compile (only the default path, " \
            "torch.func and jax.jit)."
    lines = [measured_at(doc, source), "",
             f"Explicit compiles against jax.jit (itself a compile) on {len(names)} workloads "
             f"({', '.join(names)}). Each cell: the geometric mean over those workloads of one compile's "
             "time from its first call to its N-th (fresh process) divided by jax.jit's; below 1 means that "
             "compile had spent less time than jax.jit by the N-th call. In brackets: how many workloads "
             "reached N on both.", "",
             "| N | " + " | ".join(f"{ttn.curve_label(m, c)} / jax.jit" for m, c in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for n in doc["ns"]:
        cells = [_ratio_cell([ttn.over_jax(g, n, m, c) for g in groups]) for m, c in columns]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def noise(source: Path) -> str:
    """The gate's calibrated noise floors of one machine, per signal family."""
    doc = json.loads(source.read_text())
    lines = ["| signal family | signals | median floor | largest floor |", "| --- | --- | --- | --- |"]
    for family, f in sorted(doc["families"].items()):
        lines.append(f"| {family} | {f['signals']} | {f['median']:.1%} | {f['max']:.1%} |")
    return "\n".join(lines)


def noise_figure(source: Path) -> str:
    """The one noise figure the docs quote: a machine's calibrated floors in a sentence, the time
    signals (ratios timed in one process) and the instruction counts apart."""
    doc = json.loads(source.read_text())
    floors = doc["floors"]
    times = [v for k, v in floors.items() if "instructions" not in k]
    counts = [v for k, v in floors.items() if "instructions" in k]
    shown = _shown(source)
    text = (f"On `{doc['machine']}` the gate's calibrated noise floor (from {doc['aa_runs']} A/A runs, the "
            f"same commit as base and head; 1.5 times the largest change they showed) is "
            f"{stats.median(times):.0%} for the median of its {len(times)} time signals, ratios timed "
            f"in one process, and {max(times):.0%} for the noisiest")
    if counts:
        text += f"; {max(counts):.0%} for an instruction count"
    return text + f" (`{shown}`)."


def coverage(source: Path) -> str:
    """The OpInfo coverage report's summary: the engine against torch.func over the same cases."""
    summary = json.loads(source.read_text())["summary"]
    statuses = ("native", "fallback", "mismatch", "error", "skip")
    lines = ["| vmap of | " + " | ".join(statuses) + " |", "| --- |" + " --- |" * len(statuses)]
    for side, label in (("engine", "engine"), ("torch_func", "torch.func")):
        lines.append(f"| {label} | " + " | ".join(str(summary[side][s]) for s in statuses) + " |")
    return "\n".join(lines)


def memlimit(source: Path) -> str:
    """The memory-limit experiment: the largest batch per workload and method within the budget."""
    doc = json.loads(source.read_text())
    methods: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    order: list[tuple[str, str]] = []
    mark = {"memory": "", "time": " (t)", "cap": " (cap)"}
    for r in doc["rows"]:
        key = (r["workload"], r["size"])
        if key not in order:
            order.append(key)
        if r["method"] not in methods:
            methods.append(r["method"])
        cells[key + (r["method"],)] = (
            f"{r['max_batch']}{mark.get(r.get('limited_by'), '')}" if r["status"] == "ok" else r["status"])
    lines = ["| workload | size | " + " | ".join(methods) + " |", "| --- | --- |" + " --- |" * len(methods)]
    for key in order:
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells.get(key + (m,), "-") for m in methods) + " |")
    return "\n".join(lines)


def fused_backends(source: Path) -> str:
    """`vmapbench fused-backends`' table of a stored run, under the line saying where it was measured."""
    from vmapbench.fused_backends import table

    doc = json.loads(source.read_text())
    return measured_at(doc, source) + "\n\n" + table(doc["rows"], doc["backends"])


def torch_versions(source: Path) -> str:
    """One commit's quick selection under each torch release (`make bench TORCH=...`): `source` is
    one release's asv result file; its siblings of the same commit under other releases are read
    with it. Per case the dashboard's Torch versions figures: time per call and one call's memory
    per release, the newest release's time over the oldest's, and the fallback calls (the
    engine's own on an engine method, torch.func's own on torch.func)."""
    from dashboards.loader import load_result_files
    from dashboards.numbers import format_estimate
    from dashboards.theme import method_label
    from dashboards.views.torch_versions import TORCH_ENV, version_cases, version_rows

    commit = source.name.split("-")[0]
    files = [p for p in sorted(source.parent.glob(f"{commit}-*.json")) if TORCH_ENV.search(p.stem)]
    found = version_rows(load_result_files(files).frame)
    if not found:
        raise ValueError(f"{source}: no results of commit {commit} under two torch releases beside it")
    ((machine, (full_commit, versions, rows)),) = found.items()
    cases = version_cases(versions, rows)
    oldest, newest = versions[0], versions[-1]

    def cell(est: Any, unit: str) -> str:
        return "–" if est is None else format_estimate(est, unit)

    shown = ", ".join(f"`{_shown(p)}`" for p in files)
    lines = [f"Measured on `{machine}` at commit `{full_commit[:8]}` under torch {', '.join(versions)}; "
             f"from {shown}.", "",
             "| workload | size | method | device | " + " | ".join(f"time · {v}" for v in versions)
             + f" | {newest} ÷ {oldest} | " + " | ".join(f"memory · {v}" for v in versions)
             + " | " + " | ".join(f"fallbacks · {v}" for v in versions) + " |",
             "| --- | --- | --- | --- |" + " --- |" * (3 * len(versions) + 1)]
    for c in cases:
        fallbacks = ["–" if c.fallbacks[v] is None else str(c.fallbacks[v]) for v in versions]
        lines.append(f"| {c.workload} | {c.size} | {method_label(c.method)} | {c.device} | "
                     + " | ".join(cell(c.time[v], "seconds") for v in versions)
                     + f" | {cell(c.change, 'x')} | " + " | ".join(cell(c.memory[v], "bytes") for v in versions)
                     + " | " + " | ".join(fallbacks) + " |")
    return "\n".join(lines)


def torch_coverage(source: Path) -> str:
    """The OpInfo coverage of each torch release side by side: `source` is one release's report
    (results/coverage/torch-<version>/latest.json), read with its siblings of the other releases;
    per release the engine's and torch.func's counts by status, then the ops whose torch.func
    status changed between releases."""
    from dashboards.artifacts import load_torch_coverage
    from dashboards.views.torch_versions import COVERAGE_STATUSES, SIDES, coverage_changes, version_key

    reports = load_torch_coverage(source.parent.parent.parent)
    versions = sorted(reports, key=version_key)
    lines = ["| torch | engine commit | " + " | ".join(f"engine {s}" for s in COVERAGE_STATUSES) + " | "
             + " | ".join(f"torch.func {s}" for s in COVERAGE_STATUSES) + " |",
             "| --- | --- |" + " --- |" * (2 * len(COVERAGE_STATUSES))]
    for v in versions:
        summary = reports[v].meta["summary"]
        counts = [str(summary[side][s]) for side in ("engine", "torch_func") for s in COVERAGE_STATUSES]
        lines.append(f"| {v} | `{reports[v].meta.get('engine_commit', '?')}` | " + " | ".join(counts) + " |")
    changed = [(op, label, s) for side, label in SIDES for op, s in coverage_changes(reports, side)]
    if changed:
        lines += ["", "Ops whose status changed between releases (– where a release's OpInfo has no such op):", "",
                  "| op | vmap of | " + " | ".join(versions) + " |", "| --- | --- |" + " --- |" * len(versions)]
        lines += [f"| `{op}` | {label} | " + " | ".join(s.get(v, "–") for v in versions) + " |" for op, label, s in changed]
    return "\n".join(lines)


def gate_checks(source: Path) -> str:
    """The gate's A/A and planted-slowdown runs on one machine (`vmapbench gate --calibrate
    --record`): per kind of run, how many exited 0, 1 (a regression called) and 2, the gated
    signals whose point estimate lay beyond their floor, the run's own noise and its time."""
    doc = json.loads(source.read_text())
    kinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in doc["runs"]:
        kinds[run["kind"]].append(run)
    lines = [_runs_on(doc, source),
             "", "| runs of | runs | exit 0 / 1 / 2 | signals beyond their floor, per run | inconclusive, per run "
             "| own noise (twin), median | load at start | minutes, median |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind, runs in kinds.items():
        exits = " / ".join(str(sum(r["exit_code"] == code for r in runs)) for code in (0, 1, 2))
        noise = [r["twin_noise"] for r in runs if r.get("twin_noise") is not None]
        loads = [r["load"] for r in runs if r.get("load") is not None]
        lines.append(f"| {kind} | {len(runs)} | {exits} | {', '.join(str(len(r['beyond'])) for r in runs)} | "
                     f"{', '.join(str(r['verdicts'].get('inconclusive', 0)) for r in runs)} | "
                     f"{f'{stats.median(noise):.1%}' if noise else '-'} | "
                     f"{f'{min(loads):.1f}-{max(loads):.1f}' if loads else '-'} | "
                     f"{stats.median([r['seconds'] for r in runs]) / 60:.1f} |")
    return "\n".join(lines)


def asv_continuous(source: Path) -> str:
    """`asv continuous` and the gate on the same commits (`python -m vmapbench.asv_runs --record`):
    per run, each command's exit code and minutes, asv's verdict line, the benchmarks it stored a
    result for (a parameterized one counted once) and what each called slower."""
    doc = json.loads(source.read_text())
    lines = [_runs_on(doc, source),
             "", "| run | selection | commit | load at start | asv: exit, verdict | asv: minutes, benchmarks "
             "| asv: worse / better / failed | gate: exit, slower / gated | gate: minutes "
             "| asv's worse points the gate also called slower |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in doc["runs"]:
        asv, gate, agree = run["asv"], run["gate"], run["agreement"]
        lines.append(f"| {run['kind']} | {run['selection']} | `{run['base'][:8]}` | {run['load']:.1f} | "
                     f"{asv['exit_code']}, {asv['verdict']} | {asv['seconds'] / 60:.1f}, {asv['points']} | "
                     f"{len(asv['worse'])} / {len(asv['better'])} / {len(asv['failed'])} | "
                     f"{gate['exit_code']}, {len(gate['slower'])} / {gate['gated']} | {gate['seconds'] / 60:.1f} | "
                     f"{agree['asv_worse_also_gate_slower']} of {agree['asv_worse']} |")
    named = sorted({n for run in doc["runs"] for n in run["asv"]["worse"]})
    if named:
        lines += ["", "asv's worse points, every run: " + ", ".join(f"`{n}`" for n in named[:40])
                  + (f" and {len(named) - 40} more" if len(named) > 40 else "") + "."]
    return "\n".join(lines)


KINDS: dict[str, Callable[[Path], str]] = {
    "peers": peers,
    "peers-compile": peers_compile,
    "peers-headline": peers_headline,
    "time-to-n": time_to_n,
    "time-to-n-headline": time_to_n_headline,
    "time-to-n-compiled": time_to_n_compiled,
    "noise": noise,
    "noise-figure": noise_figure,
    "gate-checks": gate_checks,
    "asv-continuous": asv_continuous,
    "coverage": coverage,
    "memlimit": memlimit,
    "fused-backends": fused_backends,
    "torch-versions": torch_versions,
    "torch-coverage": torch_coverage,
}


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def render(text: str, root: Path = ROOT) -> str:
    """`text` with every marked table rendered afresh from its source."""

    def one(m: re.Match[str]) -> str:
        kind, source = m["kind"], root / m["source"]
        if kind not in KINDS:
            raise ValueError(f"unknown table kind {kind!r} (known: {', '.join(KINDS)})")
        if not source.is_file():
            raise FileNotFoundError(f"table {kind!r}: its source {m['source']} does not exist")
        return m[1] + KINDS[kind](source).strip() + "\n" + m[5]

    out, at = [], 0
    for fence in FENCE.finditer(text):
        out += [MARKER.sub(one, text[at:fence.start()]), fence[0]]
        at = fence.end()
    return "".join(out + [MARKER.sub(one, text[at:])])


def tables(text: str) -> list[re.Match[str]]:
    """The marked tables of a page, outside its code blocks."""
    return list(MARKER.finditer(FENCE.sub(lambda m: " " * len(m[0]), text)))


def stale(root: Path = ROOT) -> list[str]:
    """'page: kind source' for each table whose committed text differs from its data."""
    out = []
    for page in pages(root):
        text = page.read_text()
        fresh = render(text, root)
        if fresh != text:
            for old, new in zip(tables(text), tables(fresh)):
                if old[0] != new[0]:
                    out.append(f"{page.relative_to(root)}: {old['kind']} {old['source']}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vmapbench.docs_tables", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale tables (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for item in found:
            print(f"stale table: {item} (run `python -m vmapbench.docs_tables`)")
        return 1 if found else 0
    for page in pages():
        text = page.read_text()
        fresh = render(text)
        if fresh != text:
            page.write_text(fresh)
            print(f"updated {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
