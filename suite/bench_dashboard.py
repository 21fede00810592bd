"""Build speed of the offline dashboard over 1000 ASV result files (the aim: seconds, not minutes).

setup_cache writes 1000 synthetic result files (dashboards.synthetic: 2 machines x 500 commits of
a dozen workloads, about the real suite's shape: ~100 benchmarks and ~3000 values per file, one
machine on the quick profile, one on the full grid with cuda, an engine regression to find);
time_build builds the whole dashboard from them (load, every view, every page, asset copy) into
one output folder. Only the full profile runs it: the quick one (`make bench`) skips it to stay
short.

As a script it generates the files into a temporary folder and times cold and warm builds:

    python suite/bench_dashboard.py [--files 1000] [--keep DIR]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

FILES = 1000
MACHINES = 2


def generate(root: Path, files: int = FILES) -> Path:
    """Write `files` synthetic result files under root/results; returns that folder."""
    from dashboards.synthetic import BENCH_WORKLOADS, write_results

    results = root / "results"
    write_results(results, commits=files // MACHINES, machines=MACHINES, workloads=BENCH_WORKLOADS,
                  samples=False)  # `make bench` does not pass asv --record-samples
    return results


def _quick_profile() -> bool:
    try:
        from . import selection
    except ImportError:  # run as a script
        return False
    return selection.active_profile() == "quick"


class DashboardBuild:
    """`vmapbench dashboard` over 1000 result files, end to end."""

    timeout = 900.0
    number = 1
    repeat = (1, 5, 60.0)
    rounds = 1
    warmup_time = 0.0

    def setup_cache(self) -> str:
        if _quick_profile():
            return ""  # asv passes nothing on when setup_cache returns None; "" means "skip"
        # asv runs setup_cache in a temporary folder that lives as long as this class's benchmarks.
        return str(generate(Path.cwd()))

    def setup(self, results: str) -> None:
        if not results:
            raise NotImplementedError("the dashboard build benchmark runs in the full profile only")
        from dashboards.builder import build_dashboard  # imported here, outside the timing

        self.build = build_dashboard
        self.out = Path(tempfile.mkdtemp(prefix="vmapbench-dashboard-"))

    def teardown(self, results: str) -> None:
        shutil.rmtree(getattr(self, "out", ""), ignore_errors=True)

    def time_build(self, results: str) -> None:
        self.build(results, self.out)

    def track_rows(self, results: str) -> int:
        """Values loaded from the 1000 files (what time_build processes)."""
        return self.build(results, self.out).rows

    track_rows.unit = "values"  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=FILES, help="result files to generate (even)")
    parser.add_argument("--keep", type=Path, default=None, help="generate here and keep (default: a temp dir)")
    parser.add_argument("--builds", type=int, default=3, help="builds to time after the cold one")
    args = parser.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="vmapbench-dash-bench-"))
    start = time.perf_counter()
    results = root / "results"
    if not any(results.glob("*/*.json")):
        generate(root, args.files)
    print(f"generated {args.files} result files in {time.perf_counter() - start:.1f} s: {results}")
    start = time.perf_counter()
    from dashboards.builder import build_dashboard
    print(f"import dashboards.builder (pandas, plotly.io, workloads): {time.perf_counter() - start:.2f} s")
    out = root / "out"
    for i in range(1 + args.builds):
        start, cpu = time.perf_counter(), time.process_time()
        result = build_dashboard(results, out)
        print(f"build {i + 1}{' (cold: copies plotly.min.js)' if i == 0 else ''}: "
              f"{time.perf_counter() - start:.2f} s wall, {time.process_time() - cpu:.2f} s CPU; "
              f"{result.files} files, {result.rows} values, {sum(result.pages.values())} figures")
    print(f"dashboard: {result.index}")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
