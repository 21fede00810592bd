"""Instruction counts of measured regions under valgrind's callgrind: the gate's deterministic signals.

Why: on a shared 2-core machine the CPU time of the engine's Python (per-op dispatch, the eager
and replay paths of a workload) moves between two processes of one commit by more than a change
the gate must see; the number of instructions the region executes barely moves (the measured
noise: docs/design/gate.md). As CodSpeed does, the measuring process runs under
`valgrind --tool=callgrind` with instrumentation off (`--instr-atstart=no`: imports, set-up and
first calls run at valgrind's uninstrumented speed, ~10x native instead of ~50x) and collection
off (`--collect-atstart=no`); the process then asks callgrind through its client requests
(valgrind/callgrind.h, compiled here into a tiny shared library that ctypes loads) to instrument,
to collect around one call, and to dump the count of that call to its own file, labelled.

- `available()`: None when counts can be taken, else the reason (no valgrind, no C compiler, no
  callgrind.h): the gate then skips the count signals and says why; it never fails for it.
- `build_requests(folder)`: the client-request library (compiled once per gate run).
- `command(out_dir)`: the valgrind prefix of a counting process.
- `Requests`: the ctypes face of the library inside that process (`region(label)`).
- `read_dumps(out_dir)`: label -> instructions (callgrind's `totals:` line of each dump).
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

VALGRIND = "valgrind"
HEADER = Path("/usr/include/valgrind/callgrind.h")
LIBRARY = "vmapbench_callgrind.so"
# The requests of callgrind.h we use, one C function each (ctypes cannot issue the macros itself:
# a client request is a special instruction sequence that only valgrind's JIT recognizes).
SOURCE = """\
#include <valgrind/callgrind.h>
int vb_running_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
void vb_start_instrumentation(void) { CALLGRIND_START_INSTRUMENTATION; }
void vb_stop_instrumentation(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void vb_zero(void) { CALLGRIND_ZERO_STATS; }
void vb_toggle_collect(void) { CALLGRIND_TOGGLE_COLLECT; }
void vb_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""
OUT_PREFIX = "callgrind.out"


def available() -> str | None:
    """None when instruction counts can be taken on this machine, else why not (a skip reason)."""
    if shutil.which(VALGRIND) is None:
        return "valgrind is not installed (apt-get install valgrind); instruction-count signals skipped"
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return "no C compiler (cc) to build callgrind's client requests; instruction-count signals skipped"
    if not HEADER.is_file():
        return f"{HEADER} is missing (install valgrind's headers); instruction-count signals skipped"
    return None


def build_requests(folder: Path) -> Path:
    """Compile the client-request library into `folder`; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    src, lib = folder / "vmapbench_callgrind.c", folder / LIBRARY
    src.write_text(SOURCE)
    compiler = shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True,
                   capture_output=True, text=True)
    return lib


def command(out_dir: Path) -> list[str]:
    """valgrind's arguments for a counting process whose dumps go to `out_dir`."""
    return [VALGRIND, "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
            "--dump-line=no", "--dump-instr=no", "--compress-strings=no",
            f"--callgrind-out-file={out_dir / OUT_PREFIX}", "-q"]


class Requests:
    """Callgrind's client requests, from inside the counted process (library from build_requests)."""

    def __init__(self, library: Path | str) -> None:
        self.lib = ctypes.CDLL(str(library))
        self.lib.vb_dump.argtypes = [ctypes.c_char_p]
        self.on_valgrind = bool(self.lib.vb_running_on_valgrind())
        self.instrumenting = False

    def instrument(self, on: bool) -> None:
        """Instrumentation on (from now every executed instruction can be counted) or off. Turning
        it on discards valgrind's translations, so a process turns it on once, after its set-up."""
        if on != self.instrumenting:
            (self.lib.vb_start_instrumentation if on else self.lib.vb_stop_instrumentation)()
            self.instrumenting = on

    @contextlib.contextmanager
    def region(self, label: str) -> Iterator[None]:
        """Count the instructions of the block and dump them under `label` (garbage collected before,
        collector off inside: a collection's work lands wherever it happens to be triggered)."""
        if "\n" in label:
            raise ValueError(f"a region label is one line: {label!r}")
        self.instrument(True)
        gc.collect()
        gc.disable()
        self.lib.vb_zero()
        self.lib.vb_toggle_collect()
        try:
            yield
        finally:
            self.lib.vb_toggle_collect()
            gc.enable()
            self.lib.vb_dump(label.encode())


_DESC = re.compile(r"^desc: Trigger: Client Request: (?P<label>.*)$", re.M)
_TOTALS = re.compile(r"^totals: (?P<n>\d+)", re.M)


def read_dumps(out_dir: Path) -> dict[str, int]:
    """label -> instructions of every region dumped into `out_dir` (files callgrind.out.N)."""
    counts: dict[str, int] = {}
    for path in sorted(out_dir.glob(f"{OUT_PREFIX}*")):
        counts.update(parse_dump(path.read_text(errors="replace")))
    return counts


def parse_dump(text: str) -> dict[str, int]:
    """{label: instructions} of one callgrind dump made by a client request ({} for other dumps,
    such as the one at program termination). The `totals:` line is read, not `summary:`, which
    callgrind 3.19 can print wrapped around below zero after a zeroing request."""
    desc, totals = _DESC.search(text), _TOTALS.search(text)
    if desc is None or totals is None:
        return {}
    return {desc.group("label").strip(): int(totals.group("n"))}
