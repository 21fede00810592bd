"""Code says what it does, not how it got there (docs/design/architecture.md): the engine names no
workload, no comment or docstring of any package quotes a timing, a commit hash or a date (those
live in results/, the docs' generated tables and docs/lab/), and no package imports another's
private names."""
from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dashboards", "engine", "measuring", "suite", "vmapbench", "workloads")

# 7-40 hex digits holding a letter and a digit, standing alone (not inside a word, path or number).
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
# A calendar date, but not a path naming a dated note (docs/lab/2026-11-27-....md).
DATE = re.compile(r"(?<![\w/-])20\d\d-[01]\d-[0-3]\d(?![\w-])")
# A duration: a number (or a range) and a time unit.
TIMING = re.compile(r"(?<![\w.])~?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:ms|us|µs|ns|s)\b")


def python_files(*packages: str, root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in packages for p in (root / pkg).rglob("*.py"))


def prose(path: Path) -> tuple[tuple[int, str], ...]:
    """(line, text) of every comment and docstring of a Python file (read once per file and
    content: the checks below each scan every file)."""
    return _prose(path, path.read_text())


@functools.lru_cache(maxsize=None)
def _prose(path: Path, source: str) -> tuple[tuple[int, str], ...]:
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return tuple(found)


def matches(pattern: re.Pattern[str], files: list[Path]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line}: {m[0]!r}"
            for p in files for line, text in prose(p) for m in pattern.finditer(text)]


def workload_names() -> list[str]:
    from workloads.base import all_workloads

    return sorted(w.name for w in all_workloads())


def test_the_engine_names_no_workload() -> None:
    names = workload_names()
    assert len(names) > 10, "the registry did not load"
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    found = [f"{p.relative_to(ROOT)}:{i}: {m[0]}" for p in python_files("engine")
             for i, line in enumerate(p.read_text().splitlines(), 1) for m in pattern.finditer(line)]
    assert not found, ("engine/ must not name a workload (say what property of a function a rule or "
                       "check is for, and cite the test that pins it):\n" + "\n".join(found))


def test_no_commit_hash_or_date_in_comments() -> None:
    files = python_files(*PACKAGES, "tests")
    found = matches(COMMIT, files) + matches(DATE, files)
    assert not found, ("comments and docstrings say what and why; commits and dates of a measurement "
                       "belong in results/ or a dated note under docs/lab/:\n" + "\n".join(found))


# A code literal (`1e-7`, '1 ms') in prose is an example of a format or a value, not a measurement.
LITERAL = re.compile(r"`[^`\n]*`|(?<!\w)'[^'\n]*'(?!\w)|\"[^\"\n]*\"")


def timings(files: list[Path]) -> list[str]:
    """'file:line: timing' for each duration quoted in a comment or docstring, outside code literals."""
    return [f"{p.relative_to(ROOT)}:{line}: {m[0]!r}"
            for p in files for line, text in prose(p) for m in TIMING.finditer(LITERAL.sub("", text))]


def test_no_timing_in_comments() -> None:
    found = timings(python_files(*PACKAGES))
    assert not found, ("comments and docstrings quote no timings (they go stale; measurements live in "
                       "results/ and docs/lab/): say what and why, and cite the test that pins the "
                       "behaviour:\n" + "\n".join(found))


def test_the_patterns_catch_what_they_are_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""Measured at 9e669c4 on 2026-11-26: 41.8 ms."""\n# 2.5 us per op, see docs/lab/2026-11-27-x.md\n'
                      'x = "9e669c4"  # deadbeef0 abc and 1234567 and 0x1f2e3d4c5\n')
    texts = " ".join(t for _, t in prose(sample))
    assert sorted(m[0] for m in COMMIT.finditer(texts)) == ["9e669c4", "deadbeef0"]
    assert [m[0] for m in DATE.finditer(texts)] == ["2026-11-26"]
    assert sorted(m[0] for m in TIMING.finditer(texts)) == ["2.5 us", "41.8 ms"]
    sample.write_text('"""Shows \'1 ms\', not `0.9996e-3 s`; the engine\'s call took 3 ms."""\n')
    assert [m[0] for m in TIMING.finditer(LITERAL.sub("", prose(sample)[0][1]))] == ["3 ms"]


def private_imports(root: Path = ROOT) -> list[str]:
    """'file:line: module.name' for each import of another package's private module or name."""

    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    found = []
    for path in python_files(*PACKAGES, root=root):
        package = path.relative_to(root).parts[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names
                      if n.split(".")[0] in PACKAGES and n.split(".")[0] != package and any(map(private, n.split(".")))]
    return found


def test_no_private_name_is_imported_across_packages() -> None:
    found = private_imports()
    assert not found, ("a name another package imports is public: drop its leading underscore (and list it "
                       "in the module's __all__ where it has one):\n" + "\n".join(found))


def test_private_imports_are_found(tmp_path: Path) -> None:
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "vmapbench" / "a.py").write_text("from engine.trace import trace, _compile\nfrom vmapbench import _own\n")
    (tmp_path / "suite" / "b.py").write_text("import engine._dispatch\nfrom workloads import measure\n")
    assert private_imports(tmp_path) == ["suite/b.py:1: engine._dispatch", "vmapbench/a.py:1: engine.trace._compile"]
