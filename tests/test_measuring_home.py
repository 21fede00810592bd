"""One timer and one statistics home: outside measuring/, no module times callables against each
other with its own clock loop (measuring.timer.rounds does), and none computes a quartile, a
percentile, a median or a geometric mean by hand (measuring.stats does).

The checks read the code's syntax tree, so they look for the shapes those computations take:
- a statistic: a call of `statistics.median`/`quantiles`/`geometric_mean`, numpy's `median`/
  `quantile`/`percentile` (and their nan- variants); `exp` of a mean of `log`s; an element of a
  sorted list picked by its length (`sorted(x)[len(x) // 2]`, `ordered[int(0.9 * len(ordered))]`);
- a timer: a loop that reads a clock (`time.perf_counter`, `process_time`, ...) while calling a
  callable the loop picks (`for f in fns: ... f() ...`), or that calls a clock-reading function of
  its module with such a callable or twice (`_timed(fns[m])`, `_batch(a, n), _batch(b, n)`).
A loop timing one call over and over (the profiler's loop, a deadline) is none of these.

The engine is checked too, with one home of its own: it sits below measuring/ and imports nothing
of it, so the timing its run-time choices need (a layout, a tier's trial) and their medians live
in engine/timed_choices.py (ENGINE_HOME), and nowhere else in engine/.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("dashboards", "suite", "vmapbench", "workloads", "engine")
ENGINE_HOME = Path("engine") / "timed_choices.py"

CLOCKS = {"perf_counter", "perf_counter_ns", "process_time", "process_time_ns", "thread_time", "monotonic"}
STATISTICS = {"median", "median_low", "median_high", "quantiles", "geometric_mean"}
NUMPY = {"median", "nanmedian", "quantile", "nanquantile", "percentile", "nanpercentile"}
MEANS = {"mean", "fmean", "sum"}
LOOPS = (ast.For, ast.AsyncFor, ast.While)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def dotted(node: ast.AST) -> str:
    """'a.b.c' of a name or attribute chain ('' for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def called(node: ast.AST) -> str:
    return dotted(node.func) if isinstance(node, ast.Call) else ""


def within(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes below `node`, not entering nested functions, lambdas or classes."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, SCOPES):
            yield from within(child)


def is_clock(node: ast.AST, clock_names: set[str]) -> bool:
    name = called(node)
    return name in clock_names or (name.startswith("time.") and name[5:] in CLOCKS)


def clock_names(tree: ast.Module) -> set[str]:
    """Names a module gave the clocks (`from time import perf_counter`, `_perf = time.perf_counter`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            names |= {a.asname or a.name for a in node.names if a.name in CLOCKS}
        elif isinstance(node, ast.Assign) and dotted(node.value).startswith("time.") \
                and dotted(node.value)[5:] in CLOCKS:
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def hand_statistics(tree: ast.Module) -> Iterator[tuple[int, str]]:
    sorted_names = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and called(node.value) == "sorted"
                    for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        name = called(node)
        if name.startswith("statistics.") and name.split(".")[-1] in STATISTICS:
            yield node.lineno, name
        elif name.split(".")[0] in ("np", "numpy") and name.split(".")[-1] in NUMPY:
            yield node.lineno, name
        elif name.split(".")[-1] == "exp" and any(
                called(inner).split(".")[-1] in MEANS and any(called(c).split(".")[-1] == "log" for c in ast.walk(inner))
                for inner in ast.walk(node) if inner is not node):
            yield node.lineno, "exp of a mean of logs"
        elif isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
            picked = called(node.value) == "sorted" or (isinstance(node.value, ast.Name) and node.value.id in sorted_names)
            if picked and any(called(c) == "len" for c in ast.walk(node.slice)):
                yield node.lineno, "an element of a sorted list picked by its length"


def picks(call: ast.Call, chosen: set[str]) -> bool:
    """Whether `call` calls a callable the loop picked: `f()` or `fns[m]()` for a loop variable."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in chosen
    return isinstance(func, ast.Subscript) and bool(names_in(func.slice) & chosen)


def timing_helpers(tree: ast.Module, clocks: set[str]) -> set[str]:
    """Names of the module's functions that read a clock around a call of a callable parameter."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
            if any(times_a_call(block, clocks, params) for block in blocks(node)):
                found.add(node.name)
    return found


def blocks(node: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every statement list under `node` (bodies of functions, loops, branches, with, try)."""
    for child in (node, *within(node)):
        for field in ("body", "orelse", "finalbody"):
            value = getattr(child, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield value


def times_a_call(block: list[ast.stmt], clocks: set[str], chosen: set[str]) -> bool:
    """A clock read, then a statement calling one of `chosen`, then a clock read, in one block."""
    marks = []
    for stmt in block:
        nodes = [stmt, *within(stmt)]
        if any(is_clock(n, clocks) for n in nodes):
            marks.append("clock")
        if any(isinstance(n, ast.Call) and picks(n, chosen) for n in nodes):
            marks.append("call")
    text = " ".join(marks)
    return "clock call" in text and "call clock" in text[text.index("clock call"):]


def loops(tree: ast.Module) -> Iterator[tuple[ast.AST, set[str], list[ast.AST]]]:
    """(loop, its variables, what it repeats) of every loop and comprehension."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            yield node, loop_variables(node), node.body
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            chosen = {n for g in node.generators for n in names_in(g.target)}
            yield node, chosen, [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]


def loop_variables(loop: ast.AST) -> set[str]:
    return names_in(loop.target) if isinstance(loop, (ast.For, ast.AsyncFor)) else set()


def hand_timers(tree: ast.Module) -> Iterator[tuple[int, str]]:
    clocks = clock_names(tree)
    helpers = timing_helpers(tree, clocks)
    for loop, chosen, body in loops(tree):
        if isinstance(loop, LOOPS) and chosen and any(times_a_call(block, clocks, chosen) for block in blocks(loop)):
            yield loop.lineno, "a clock read around a callable the loop picks"
            continue
        nodes = [n for part in body for n in (part, *within(part))]
        helped = [n for n in nodes if called(n) in helpers]
        if len(helped) >= 2 or any(names_in(c) & chosen for c in helped):
            yield loop.lineno, f"{called(helped[0])}() timing callables in turn"


Check = Callable[[ast.Module], Iterator[tuple[int, str]]]


def findings(check: Check, packages: tuple[str, ...] = CHECKED, root: Path = ROOT) -> list[str]:
    return [f"{path.relative_to(root)}:{line}: {what}"
            for path in sorted(p for pkg in packages for p in (root / pkg).rglob("*.py"))
            if path.relative_to(root) != ENGINE_HOME
            for line, what in check(ast.parse(path.read_text(), str(path)))]


def test_no_statistic_is_computed_by_hand() -> None:
    found = findings(hand_statistics)
    assert not found, ("medians, quartiles, percentiles and geometric means come from measuring.stats "
                       "(add what is missing there, with a test):\n" + "\n".join(found))


def test_no_callables_are_timed_against_each_other_by_hand() -> None:
    found = findings(hand_timers)
    assert not found, ("callables timed against each other go through measuring.timer.rounds (its options: "
                       "batches, clock, alternate, rotate, warm-up rounds, ...):\n" + "\n".join(found))


HAND_MADE = {
    "median.py": "import statistics\ndef m(xs):\n    return statistics.median(xs)\n",
    "quartiles.py": "import statistics\nq = statistics.quantiles([1.0, 2.0, 3.0], n=4)\n",
    "numpy_quantile.py": "import numpy as np\ndef q(xs):\n    return float(np.quantile(xs, 0.9))\n",
    "geomean.py": "import math, statistics\ndef g(xs):\n    return math.exp(statistics.fmean(math.log(x) for x in xs))\n",
    "upper_median.py": "def m(xs):\n    ordered = sorted(xs)\n    return ordered[len(ordered) // 2]\n",
    "p90.py": "def p(xs):\n    return sorted(xs)[min(len(xs) - 1, int(0.9 * len(xs)))]\n",
    "rounds.py": ("import time\ndef t(fns, n):\n    out = [[] for _ in fns]\n    for _ in range(n):\n"
                  "        for i, f in enumerate(fns):\n            s = time.perf_counter()\n            f()\n"
                  "            out[i].append(time.perf_counter() - s)\n    return out\n"),
    "helper_pair.py": ("import time\ndef _batch(f, n):\n    s = time.process_time()\n    for _ in range(n):\n"
                       "        f()\n    return time.process_time() - s\n"
                       "def r(a, b, n):\n    return [_batch(a, n) / _batch(b, n) for _ in range(n)]\n"),
    "helper_picked.py": ("from time import perf_counter\ndef _timed(f):\n    s = perf_counter()\n    f()\n"
                         "    return perf_counter() - s\n"
                         "def r(fns, n):\n    return {m: [_timed(fns[m]) for _ in range(n)] for m in fns}\n"),
}
LEGITIMATE = {
    "profiler_loop.py": ("import time\ndef loop(call, limit):\n    times = []\n    start = time.perf_counter()\n"
                         "    while True:\n        t0 = time.perf_counter()\n        call()\n"
                         "        times.append(time.perf_counter() - t0)\n        if t0 - start > limit:\n"
                         "            break\n    return times\n"),
    "middle_size.py": "def middle(sizes):\n    return sizes[len(sizes) // 2]\n",
    "exp_of_sum.py": "import math\ndef f(x):\n    return math.exp(x.sum())\n",
    "uses_stats.py": "from measuring import stats\ndef g(xs):\n    return stats.geomean(xs), stats.quartiles(xs)\n",
    "first_calls.py": ("import time\ndef each(jobs):\n    for job in jobs:\n        s = time.perf_counter()\n"
                       "        run(job)\n        print(time.perf_counter() - s)\n"),
}


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name, source in {**HAND_MADE, **LEGITIMATE}.items():
        (pkg / name).write_text(source)
    found = findings(hand_statistics, ("pkg",), tmp_path) + findings(hand_timers, ("pkg",), tmp_path)
    flagged = {line.split(":")[0].rsplit("/", 1)[-1] for line in found}
    assert flagged == set(HAND_MADE), found
