"""`make bench`: run the ASV suite for the current commit into results/, then build the dashboard.

    python -m vmapbench.bench                      # quick profile, cpu (what `make bench` runs)
    python -m vmapbench.bench --profile full       # every size, cpu and cuda (nightly, GPU boxes)
    python -m vmapbench.bench --family hessians    # one CI shard (see --list-families)
    python -m vmapbench.bench --workload compiled_logreg_hessian  # one workload, its cold compiles included
    python -m vmapbench.bench --merge DIR [DIR..]  # merge shards' results folders into results/
    python -m vmapbench.bench --commits REV [REV..]  # past commits, each built in asv's virtualenv

It runs `asv run` against the already installed environment (this interpreter: no environment
build) with `--set-commit-hash HEAD`, so every commit benchmarked this way adds one point to the
history of a stable machine name (VMAPBENCH_MACHINE, or derived from the hardware; registered with
`asv machine`). `make continuous` is the one that builds each commit in its own virtualenv.

Result files are named `results/<machine>/<commit8>-<env>.json` with no local path in them: asv
names the existing environment after its interpreter's path, so its files are renamed after the
run to `existing-py<X.Y>-torch<version>` (clean_result_names). Timings keep their samples
(`--record-samples`) for the intervals of measuring.stats.

A benchmark that fails does not lose the others: asv keeps every result; this script then still
builds the dashboard, lists the failed benchmarks and exits non-zero only when nothing ran.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Iterable, Iterator, Mapping, Sequence

from measuring.machine import MACHINE_ENV, cpu_model, gpu_model, machine_name
from vmapbench.commands.options import add_devices

RESULTS_ENV = "VMAPBENCH_RESULTS_DIR"
# The commit a run of the working tree is recorded under, where not HEAD: `make bench TORCH=...`
# (.ci/torch-versions) resolves HEAD once, so that every release's results are of one commit even
# when HEAD moves between them.
COMMIT_ENV = "VMAPBENCH_COMMIT"
DEFAULT_THREADS = "2"


def repo_root() -> Path:
    """The folder holding asv.conf.json: the current one or one above it, else this checkout's."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "asv.conf.json").is_file():
            return folder
    return Path(__file__).resolve().parents[1]


def results_dir(root: Path | None = None) -> Path:
    """Where results go: VMAPBENCH_RESULTS_DIR (a dry run's temporary folder), else <root>/results."""
    explicit = os.environ.get(RESULTS_ENV, "").strip()
    return Path(explicit).resolve() if explicit else (repo_root() if root is None else root) / "results"


def asv_config(root: Path, results: Path) -> list[str]:
    """`--config FILE` for asv when results go elsewhere than asv.conf.json's results_dir: a copy
    of the configuration with absolute paths and `results` as its results_dir (under .asv/; the
    run removes it)."""
    if results == root / "results":
        return []
    conf = json.loads((root / "asv.conf.json").read_text())
    conf.update(repo=str(root), benchmark_dir=str(root / conf["benchmark_dir"]), env_dir=str(root / conf["env_dir"]),
                html_dir=str(root / conf["html_dir"]), results_dir=str(results))
    path = root / ".asv" / f"asv.conf.{os.getpid()}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(conf, indent=1))
    return ["--config", str(path)]


# --- machine -----------------------------------------------------------------------------------

def _ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{round(int(line.split()[1]) / 2**20)}GB"
    except OSError:
        pass
    return "unknown"


def register_machine(name: str, env: dict[str, str]) -> dict[str, str]:
    """Record this machine's facts under `name` in asv's machine file (~/.asv-machine.json).

    What `asv machine --yes --machine NAME` does, with every field filled in: asv itself leaves
    out the fields equal to its detected defaults, and results/<machine>/machine.json (what the
    dashboard shows) then lacks the OS, architecture and CPU count.
    """
    from asv.machine import MachineCollection

    cpu = f"{cpu_model()} ({os.cpu_count()} cores; OMP_NUM_THREADS={env.get('OMP_NUM_THREADS')})"
    gpu = gpu_model()
    info = {
        "machine": name,
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpu": cpu + (f"; GPU {gpu}" if gpu else ""),
        "num_cpu": str(os.cpu_count()),
        "ram": _ram(),
        **software_facts(),
    }
    MachineCollection.save(name, info)
    return info


def software_facts(root: Path | None = None) -> dict[str, str]:
    """What a result depends on beyond the hardware: Python, torch (with its CUDA), the GPU's driver,
    and, where they differ from asv.conf.json's pins, a 'pins' line saying so (a GPU machine runs
    the Python and torch it has); 'dry_run' under the CUDA stand-in."""
    import torch

    from workloads import cuda_standin

    python = platform.python_version()
    facts = {"python": python, "torch": torch.__version__ + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else "")}
    driver = _nvml_driver()
    if driver:
        facts["driver"] = driver
    conf_file = (root or repo_root()) / "asv.conf.json"
    conf = json.loads(conf_file.read_text()) if conf_file.is_file() else {}
    pinned_python = conf.get("pythons", [""])[0]
    pinned_torch = conf.get("matrix", {}).get("req", {}).get("torch", [""])[0]
    differ = []
    if pinned_python and not python.startswith(pinned_python + "."):
        differ.append(f"Python {python} (pinned {pinned_python})")
    if pinned_torch and torch.__version__.split("+")[0] != pinned_torch:
        differ.append(f"torch {torch.__version__} (pinned {pinned_torch})")
    if differ:
        facts["pins"] = "differs from the pins: " + ", ".join(differ)
    if cuda_standin.active():
        facts["dry_run"] = (f"CUDA stood in by the CPU ({cuda_standin.ENV}=1): every figure is a CPU figure, "
                            "measured to check the GPU command, not a CUDA result")
    return facts


def _nvml_driver() -> str | None:
    """The NVIDIA driver's version through NVML, or None where there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML, no driver to name
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001
        return None
    finally:
        pynvml.nvmlShutdown()


# --- running asv -------------------------------------------------------------------------------

def asv(*args: str) -> list[str]:
    return [sys.executable, "-m", "asv", *args]


NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
LAUNCH_ENV = "VMAPBENCH_LAUNCH"


def bench_env(profile: str, devices: Sequence[str] | None, root: Path) -> dict[str, str]:
    """The environment every benchmark process inherits: profile, devices, pinned threads, caches;
    for CUDA, torch.cuda.is_available() asking NVML (see launch_args)."""
    env = dict(os.environ)
    env["VMAPBENCH_PROFILE"] = profile
    if devices:
        env["VMAPBENCH_DEVICES"] = ",".join(devices)
    if "cuda" in (devices or ()):
        env.setdefault(NVML_CHECK_ENV, "1")
    threads = env.setdefault("OMP_NUM_THREADS", DEFAULT_THREADS)
    env.setdefault("MKL_NUM_THREADS", threads)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / ".inductor-cache"))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def launch_args(env: Mapping[str, str] | None = None) -> list[str]:
    """asv's launch method: asv.conf.json's forkserver, for CUDA runs too, unless VMAPBENCH_LAUNCH
    (in `env`, default os.environ) names another.

    The fork server imports the suite once and forks a process per benchmark point. A child cannot
    use CUDA once its parent touched it, and `torch.cuda.is_available()` does (cudaGetDeviceCount;
    the engine's warm-up calls it), so every CUDA point would fail in setup with "Cannot
    re-initialize CUDA in forked subprocess". With PYTORCH_NVML_BASED_CUDA_CHECK=1
    (bench_env sets it for CUDA runs) that check asks NVML and leaves CUDA alone. Spawning a fresh
    process per point also works, but pays the suite's imports once per benchmark point instead
    of once per run, which does not fit the GPU command's time limit."""
    method = (env if env is not None else os.environ).get(LAUNCH_ENV, "").strip()
    if method and method not in ("spawn", "forkserver"):
        raise SystemExit(f"bench: {LAUNCH_ENV}={method!r}: use spawn or forkserver")
    return ["--launch-method", method] if method else []


class NaRowFilter:
    """Drops the rows of asv's result tables that hold only parameter values and 'n/a'.

    The suite's grids are full grids; a profile measures part of them, and asv prints a row for
    every point. Rows with a value, 'failed' or anything unknown are kept.
    """

    def __init__(self, param_values: Iterable[str]):
        self.known = set(param_values) | {"n/a"}

    def keep(self, line: str) -> bool:
        tokens = line.split()
        if "n/a" not in tokens or line.lstrip().startswith("["):
            return True
        return not all(t in self.known for t in tokens)


def param_values(selection: ModuleType) -> set[str]:
    """Every parameter value of the suite's grids (what NaRowFilter may drop)."""
    from workloads.base import METHODS, all_workloads

    values = set(METHODS) | set(selection.ALL_DEVICES) | {"native"}
    for w in all_workloads():
        values.update(w.sizes)
    return values


def stream(cmd: Sequence[str], env: dict[str, str], cwd: Path, row_filter: NaRowFilter | None) -> tuple[int, str]:
    """Run `cmd`, echoing its output line by line (filtered); return its exit code and output."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", bufsize=1)
    kept: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        kept.append(line)
        if row_filter is None or row_filter.keep(line):
            sys.stdout.write(line)
            sys.stdout.flush()
    return proc.wait(), "".join(kept)


def shell_regex(point: str) -> str:
    """A double-quoted --bench regex matching exactly `point` (its quotes matched by '.')."""
    return '"' + re.escape(point).replace("'", ".").replace("\\ ", " ") + '$"'


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def warn_if_dirty(root: Path, commit: str) -> None:
    dirty = git(root, "status", "--porcelain", "--", "engine", "workloads", "suite")
    if dirty:
        print(f"bench: warning: uncommitted changes in engine/, workloads/ or suite/; the results are "
              f"recorded under HEAD {commit[:8]} but measure the working tree:\n{dirty}", file=sys.stderr)


@contextlib.contextmanager
def pass_folder(env: dict[str, str], keep: bool) -> Iterator[None]:
    """A folder for this run's case passes (suite.workload_pass), named in `env`, removed after.

    With it, one process per case measures every method's in-process figures and the other track
    processes read them. Not for --commits (keep=False): each commit must measure its own, which
    the suite's folder per asv run of a commit gives (suite.workload_pass)."""
    from suite.workload_pass import PASS_DIR_ENV

    if not keep:
        env.pop(PASS_DIR_ENV, None)
        yield
        return
    folder = tempfile.mkdtemp(prefix="vmapbench-passes-")
    env[PASS_DIR_ENV] = folder
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


def timing_line(make_started: float | None, run_started: float, asv_started: float,
                dashboard_started: float, ended: float) -> str:
    """Where the time of `make bench` went: the install apart from the run (asv, dashboard)."""
    install = (f"environment install {_minutes(run_started - make_started)} (make's prerequisites; "
               "~0 when already installed), " if make_started is not None else "")
    return (f"bench: timing: {install}run {_minutes(ended - run_started)} (asv {_minutes(dashboard_started - asv_started)}, "
            f"dashboard {_minutes(ended - dashboard_started)}, the rest {_minutes(asv_started - run_started)})")


# --- reading results back ----------------------------------------------------------------------

def run_outcome(results_dir: Path, machine: str, commit: str, since_ms: float,
                regexes: Sequence[str], env_prefix: str = "existing") -> tuple[int, list[str]]:
    """(values measured, failed 'benchmark(params)') among this run's benchmarks of `commit`.

    asv stores a failed point as None and a skipped one as NaN; points are this run's when their
    benchmark started after `since_ms` and they match the run's --bench regexes.
    """
    from asv import results as asv_results

    measured, failed = 0, []
    for res in asv_results.iter_results_for_machine_and_hash(str(results_dir), machine, commit):
        if not res.env_name.startswith(env_prefix):
            continue
        for name in res.get_all_result_keys():
            if res.started_at.get(name, 0) < since_ms:
                continue
            params = res.get_result_params(name)
            values = res.get_result_value(name, params)
            points = [f"{name}({', '.join(p)})" for p in _product(params)] if params else [name]
            for point, value in zip(points, values):
                if regexes and not any(re.search(r, point) for r in regexes):
                    continue
                if value is None:
                    failed.append(point)
                elif value == value:  # not NaN (skipped)
                    measured += 1
    return measured, failed


def _product(params: list[list[str]]) -> list[tuple[str, ...]]:
    import itertools

    return list(itertools.product(*params))


# --- dashboard, merge --------------------------------------------------------------------------

def build_dashboard(root: Path, env: dict[str, str], results: Path | None = None) -> Path | None:
    """`python -m vmapbench dashboard`; the path of its index.html, or None when it cannot run."""
    if importlib.util.find_spec("vmapbench.commands.dashboard") is None:
        print("bench: the dashboard command (vmapbench/commands/dashboard.py) is not in this checkout yet; "
              "skipping it", file=sys.stderr)
        return None
    results = root / "results" if results is None else results
    proc = subprocess.run([sys.executable, "-m", "vmapbench", "dashboard", "--results", str(results)],
                          cwd=root, env=env, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        print(f"bench: building the dashboard failed (exit {proc.returncode}); the results are kept in "
              f"{results}", file=sys.stderr)
        return None
    return Path(lines[-1])


def merge_results(sources: Sequence[Path], dest: Path) -> int:
    """Merge asv results folders (e.g. CI shards' artifacts) into `dest`; returns files written.

    Shards of one commit on one machine write the same file name holding different benchmarks:
    their "results" rows are united (`merge_into`). Other files (machine.json, benchmarks.json)
    are copied when missing.
    """
    written = 0
    for source in sources:
        if not source.is_dir():
            raise SystemExit(f"bench: --merge: {source} is not a folder of asv results")
        for path in sorted(source.rglob("*.json")):
            target = dest / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                shutil.copy2(path, target)
                written += 1
                continue
            theirs = json.loads(path.read_text())
            if "results" not in theirs or "results" not in json.loads(target.read_text()):
                continue  # machine.json, benchmarks.json: the copy already there stands
            merge_into(theirs, target, f"{path} and {target}")
            written += 1
    return written


def merge_into(theirs: dict, target: Path, what: str) -> None:
    """Unite asv result `theirs` into the file `target` (same commit and environment); a
    benchmark present in both keeps the row that started last."""
    ours = json.loads(target.read_text())
    if (theirs.get("commit_hash"), theirs.get("env_name")) != (ours.get("commit_hash"), ours.get("env_name")):
        raise SystemExit(f"bench: --merge: {what} hold different commits or environments")
    if theirs.get("result_columns") != ours.get("result_columns"):
        raise SystemExit(f"bench: --merge: {what} were written by different asv versions")
    started = ours["result_columns"].index("started_at")
    for name, row in theirs["results"].items():
        mine = ours["results"].get(name)
        if mine is None or (row[started] or 0) >= (mine[started] or 0):
            ours["results"][name] = row
    ours.setdefault("durations", {}).update(
        {k: v for k, v in theirs.get("durations", {}).items() if k not in ours["durations"]})
    target.write_text(json.dumps(ours))


# --- result file names ---------------------------------------------------------------------------

def existing_env_name() -> str:
    """The environment name `make bench` records: 'existing-py<X.Y>-torch<version>'.

    asv names an existing environment after its interpreter's path
    ('existing-py_work_main_.venv_bin_python'): a local path in every result file name, different
    on every checkout. The name kept says what the results depend on, like the virtualenv names
    asv gives ('virtualenv-py3.11-torch2.13.0').
    """
    import torch

    return f"existing-py{sys.version_info.major}.{sys.version_info.minor}-torch{torch.__version__.split('+')[0]}"


def clean_result_names(results_dir: Path, env_name: str | None = None) -> list[tuple[Path, Path]]:
    """Rename result files of existing environments named after a path to `existing_env_name()`.

    The file's env_name and python fields are rewritten too (no local path is kept); when the
    clean file exists already (the same commit benchmarked before), the rows are merged into it.
    Returns (old, new) pairs.
    """
    env_name = env_name or existing_env_name()
    python = env_name.split("-py", 1)[1].split("-", 1)[0]
    renamed = []
    for path in sorted(results_dir.glob("*/*-existing-py_*.json")):
        data = json.loads(path.read_text())
        if "results" not in data or not str(data.get("env_name", "")).startswith("existing-py_"):
            continue
        data["env_name"] = env_name
        data["python"] = python
        if isinstance(data.get("params"), dict) and "python" in data["params"]:
            data["params"]["python"] = python
        target = path.with_name(f"{path.name.split('-', 1)[0]}-{env_name}.json")
        if target.exists():
            merge_into(data, target, f"{path} and {target}")
        else:
            target.write_text(json.dumps(data))  # compact, as asv writes result files
        path.unlink()
        renamed.append((path, target))
    return renamed


def one_regex(regexes: Sequence[str]) -> str:
    """The alternation of asv --bench regexes, as one shell word once double-quoted (asv matches
    each with re.search, as the alternation is)."""
    return "|".join(f"(?:{r})" for r in regexes)


# --- command line ------------------------------------------------------------------------------

def only_workloads(regexes: list[str], names: Sequence[str], selection: ModuleType) -> list[str]:
    """Those of `regexes` that select the named workloads' classes; ValueError for an unknown name."""
    import workloads

    wanted = set()
    for name in names:
        try:
            wanted.add(selection.class_name(workloads.get(name)))
        except KeyError:
            raise ValueError(f"unknown workload {name!r}; see `python -m vmapbench list`") from None
    return [r for r in regexes if any(rf"\.{cls}\." in r for cls in wanted)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vmapbench.bench", description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=("quick", "full"),
                   default=os.environ.get("VMAPBENCH_PROFILE", "quick") or "quick",
                   help="quick: the registry's quick sizes on cpu (default); full: every size, cpu and cuda")
    p.add_argument("--family", action="append", default=[],
                   help="only this workload family (repeatable; 'suite' = the suite's own benchmarks); "
                        "see --list-families")
    p.add_argument("--workload", action="append", default=[],
                   help="only this workload (repeatable; with --family, the workloads of both), with the cold "
                        "compiles the quick profile leaves out")
    add_devices(p, help="devices to measure (repeatable; default: the profile's)")
    p.add_argument("--machine", default=None, help=f"machine name (default: ${MACHINE_ENV} or derived from the hardware)")
    p.add_argument("--commits", nargs="+", metavar="REV", default=None,
                   help="benchmark these commits, each installed into asv's virtualenv (.asv/env), instead "
                        "of the working tree: backfills history, e.g. --commits HEAD~5 HEAD~2")
    p.add_argument("--no-dashboard", action="store_true", help="do not build the dashboard afterwards")
    p.add_argument("--list-families", action="store_true", help="print the families (JSON list) and exit")
    p.add_argument("--print-bench-regex", action="store_true",
                   help="print one asv --bench regex selecting the profile's cases (--family, --device too) and "
                        "the instruction counts (suite/bench_counts.py), then exit: asv continuous -b \"$(python -m vmapbench.bench --print-bench-regex)\" BASE HEAD")
    p.add_argument("--merge", nargs="+", type=Path, metavar="DIR",
                   help="merge these asv results folders into results/ and exit")
    p.add_argument("--started-at", type=float, default=None, metavar="EPOCH",
                   help="when `make bench` started (seconds since the epoch): the time before this "
                        "process is reported as the environment's install")
    p.add_argument("asv_args", nargs="*", help="extra arguments for `asv run` (after --), e.g. -- --show-stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from suite import selection  # here, not above: importing suite sets the suite's environment (suite/__init__.py)

    run_started = time.time()
    args = build_parser().parse_args(argv)
    root = repo_root()
    if args.list_families:
        print(json.dumps(selection.families()))
        return 0
    if args.merge:
        n = merge_results(args.merge, results_dir(root))
        print(f"bench: merged {n} result files into {results_dir(root)}")
        return 0

    devices = args.device or None
    env = bench_env(args.profile, devices, root)
    try:
        regexes = selection.bench_regexes(args.profile, args.family or None, devices,
                                          opt_in=args.print_bench_regex)
        if args.workload:  # the named workloads, with the --family ones if any are given
            # A named workload is asked for: its cold compiles too (the quick profile leaves them out).
            named = only_workloads(selection.bench_regexes(args.profile, None, devices, cold_compiles=True),
                                   args.workload, selection)
            regexes = [*(regexes if args.family else []), *named]
    except ValueError as exc:
        raise SystemExit(f"bench: {exc}") from None
    if args.print_bench_regex:
        print(one_regex(regexes))
        return 0
    machine = args.machine or machine_name()
    register_machine(machine, env)
    if args.commits:
        commits = [git(root, "rev-parse", rev) for rev in args.commits]
        env_prefix, where = "virtualenv", "each commit installed into .asv/env"
    else:
        commits = [git(root, "rev-parse", os.environ.get(COMMIT_ENV, "").strip() or "HEAD")]
        env_prefix, where = "existing", "the working tree, installed in this environment"
        warn_if_dirty(root, commits[0])

    print(f"bench: profile {args.profile}, devices {','.join(devices or selection.PROFILE_DEVICES[args.profile])}, "
          f"families {','.join(args.family) or 'all'}, machine {machine}, "
          f"commits {' '.join(c[:8] for c in commits)} ({where}), OMP_NUM_THREADS={env['OMP_NUM_THREADS']}",
          flush=True)
    started = time.time()
    # --record-samples: every timing's samples are kept, so the dashboard's intervals come from
    # the same numbers as the gate's (measuring.stats.row_estimate).
    results = results_dir(root)
    config = asv_config(root, results)
    common = [*config, "--machine", machine, "--durations", "10", "--record-samples", *[f"--bench={r}" for r in regexes],
              *launch_args(env), *args.asv_args]
    if args.commits:
        hashfile = root / ".asv" / "bench-commits.txt"
        hashfile.parent.mkdir(exist_ok=True)
        hashfile.write_text("\n".join(commits) + "\n")
        cmd = asv("run", *common, f"HASHFILE:{hashfile}")
    else:
        cmd = asv("run", "--environment", f"existing:{sys.executable}", "--set-commit-hash", commits[0], *common)
    with pass_folder(env, keep=not args.commits):
        rc, _ = stream(cmd, env, root, NaRowFilter(param_values(selection)))
    if config:
        Path(config[1]).unlink(missing_ok=True)
    elapsed = time.time() - started

    measured, failed = 0, []
    for commit in commits:
        m, f = run_outcome(results, machine, commit, started * 1000 - 1000, regexes, env_prefix)
        measured, failed = measured + m, failed + [f"{p} @{commit[:8]}" if args.commits else p for p in f]
    for old, new in clean_result_names(results):
        print(f"bench: {old.name} -> {new.name} (no local path in result names)")
    print(f"\nbench: asv exited {rc} after {elapsed / 60:.1f} min; {measured} values measured, "
          f"{len(failed)} failed; results in {results / machine}")
    if failed:
        print("bench: failed benchmarks (asv printed the errors of parameterized ones above):")
        for point in failed:
            print(f"  {point}")
        print(f"bench: to see one's error: VMAPBENCH_PROFILE={args.profile} {sys.executable} -m asv run "
              f"--python=same --quick --show-stderr --dry-run --machine {machine} "
              f"--bench {shell_regex(failed[0].split(' @')[0])}")

    dashboard_started = time.time()
    index = None if args.no_dashboard else build_dashboard(root, env, results)
    if index is not None:
        print(f"bench: dashboard: {index}")
    print(timing_line(args.started_at, run_started, started, dashboard_started, time.time()))
    if measured == 0:
        return rc or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
