"""The documentation: a short README, an MkDocs site that builds in strict mode (a broken link,
a missing anchor or a page left out of the nav fails), results tables that match their data, and
every VMAPBENCH_* variable documented."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_code_hygiene import COMMIT, DATE
from vmapbench import docs_tables

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(root / "mkdocs.yml"), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=300)


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move the rest into docs/"


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets, "the README links into docs/"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_docs_build_in_strict_mode(tmp_path: Path) -> None:
    done = mkdocs_build(ROOT, tmp_path / "site")
    assert done.returncode == 0, f"`mkdocs build --strict` failed:\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_strict_build_fails_on_a_broken_link_and_an_orphan_page(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n")
    with (tmp_path / "docs" / "index.md").open("a") as f:
        f.write("\n[gone](guide/no-such-page.md) [no anchor](guide/install.md#no-such-heading)\n")
    done = mkdocs_build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    for expected in ("orphan.md", "no-such-page.md", "no-such-heading"):
        assert expected in done.stderr, f"{expected!r} not reported:\n{done.stderr}"


def test_results_tables_match_their_data() -> None:
    stale = docs_tables.stale()
    assert not stale, "tables no longer match their results files; run `python -m vmapbench.docs_tables`:\n" + "\n".join(stale)


def test_every_results_table_is_generated() -> None:
    """A Markdown table that shows measurements sits between markers, except in the dated lab notes."""
    for page in docs_tables.pages():
        if "lab" in page.relative_to(ROOT).parts:
            continue
        outside = docs_tables.MARKER.sub("", docs_tables.FENCE.sub("", page.read_text()))
        headers = [line for line in outside.splitlines() if re.match(r"\|.*\b(ms|ratio|/ torch\.func|/ jax)\b.*\|", line)]
        assert not headers, f"{page.relative_to(ROOT)} has a pasted results table: {headers[0]}"


def test_a_changed_results_file_makes_its_table_stale(tmp_path: Path) -> None:
    source = "results/noise/amd-epyc-2cpu.json"
    (tmp_path / source).parent.mkdir(parents=True)
    shutil.copy(ROOT / source, tmp_path / source)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"intro\n<!-- table: noise {source} -->\n<!-- /table -->\nafter\n")
    assert docs_tables.stale(tmp_path) == [f"README.md: noise {source}"]
    (tmp_path / "README.md").write_text(docs_tables.render((tmp_path / "README.md").read_text(), tmp_path))
    assert docs_tables.stale(tmp_path) == []
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("intro\n") and text.endswith("<!-- /table -->\nafter\n") and "| 1.0% |" in text
    data = (tmp_path / source).read_text().replace('"median": 0.01', '"median": 0.02', 1)
    (tmp_path / source).write_text(data)
    assert docs_tables.stale(tmp_path) == [f"README.md: noise {source}"]


def test_the_time_to_n_headline_is_the_per_family_geomean_of_ours_over_jax() -> None:
    """The README's first headline: per family, the geometric mean of the workloads' ours/jax.jit
    time to N from the first call, counting only workloads where both curves reached N."""
    import math

    from workloads import time_to_n
    from workloads.base import get

    source = next(iter(sorted((docs_tables.ROOT / "results" / "time_to_n" / "amd-epyc-2cpu").glob("*.json"))))
    table = [line for line in docs_tables.time_to_n_headline(source).splitlines() if line.startswith("|")]
    doc, curves = time_to_n.load(source)
    groups = {k: g for k, g in time_to_n.by_workload(curves).items()
              if any(c.method == time_to_n.DEFAULT_PATH for c in g)}
    hessians = [g for (w, _), g in groups.items() if get(w).family == "hessians"]
    n = doc["ns"][-1]
    ratios = [r for r in (time_to_n.ours_over_jax(g, n) for g in hessians) if r is not None]
    want = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    row = next(line for line in table if line.startswith("| hessians |"))
    assert row.split(" | ")[-1].rstrip(" |") == f"{want:.2f} ({len(ratios)})"
    assert table[0] == "| family | " + " | ".join(f"N={k}" for k in doc["ns"]) + " |"
    assert table[-1].startswith("| **all** | ") and f"({len(groups)})" in table[-1]


def test_a_marker_in_a_code_block_is_an_example(tmp_path: Path) -> None:
    text = "```\n<!-- table: KIND results/x.json -->\n<!-- /table -->\n```\n"
    assert docs_tables.render(text, tmp_path) == text
    assert docs_tables.tables(text) == []


def test_an_unknown_kind_or_missing_source_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown table kind 'nope'"):
        docs_tables.render("<!-- table: nope results/x.json -->\n<!-- /table -->", tmp_path)
    with pytest.raises(FileNotFoundError, match="results/x.json does not exist"):
        docs_tables.render("<!-- table: noise results/x.json -->\n<!-- /table -->", tmp_path)


def test_every_vmapbench_variable_is_documented() -> None:
    code = [p for d in ("engine", "workloads", "suite", "vmapbench", "dashboards", "tests", ".ci", ".github")
            for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in ("", ".py", ".sh", ".yml")]
    code += [ROOT / "Makefile"]
    used = {m for p in code for m in re.findall(r"(?<![\w])VMAPBENCH_[A-Z0-9_]+", p.read_text(errors="replace"))}
    assert "VMAPBENCH_FUSED" in used
    documented = (ROOT / "docs" / "guide" / "environment.md").read_text()
    missing = sorted(v for v in used if f"`{v}`" not in documented)
    assert not missing, f"docs/guide/environment.md lacks {missing}"


def test_docs_pages_the_code_points_to_exist() -> None:
    code = [p for d in ("engine", "workloads", "suite", "vmapbench", "dashboards")
            for p in (ROOT / d).rglob("*.py")] + [ROOT / "Makefile", ROOT / ".ci" / "run"]
    cited = {(p.relative_to(ROOT), m) for p in code for m in re.findall(r"\bdocs/[\w/.-]+\.md", p.read_text())}
    assert any(str(path) == "engine/fused.py" for path, _ in cited), "engine/fused.py points to its design page"
    missing = sorted(f"{path}: {m}" for path, m in cited if not (ROOT / m).is_file())
    assert not missing, "code points to docs pages that do not exist:\n" + "\n".join(missing)


def test_user_and_design_pages_carry_no_dates_or_commits() -> None:
    """Dated measurements live in docs/lab/ and results/; the guide, engine and design pages describe
    the code as it is (a generated table names its results file, which may carry a commit)."""
    pages = [ROOT / "README.md", ROOT / "docs" / "index.md"]
    pages += [p for d in ("guide", "engine", "design") for p in sorted((ROOT / "docs" / d).rglob("*.md"))]
    found = []
    for page in pages:
        text = docs_tables.MARKER.sub("", page.read_text())
        found += [f"{page.relative_to(ROOT)}: {m[0]}" for pattern in (COMMIT, DATE) for m in pattern.finditer(text)]
    assert not found, "move dated figures into a note under docs/lab/ and link it:\n" + "\n".join(found)


def test_docs_index_lists_every_page_and_the_screenshot_is_small() -> None:
    """docs/index.md is the start page: it links every page but the dated lab notes (which
    lab/index.md lists), and its dashboard picture is a committed PNG small enough for a repo."""
    index = (ROOT / "docs" / "index.md").read_text()
    linked = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", index) if "://" not in t}
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")
             if p.parent.name != "lab" or p.name == "index.md"} - {"index.md"}
    missing = sorted(pages - linked)
    assert not missing, f"docs/index.md does not list {missing}"
    shot = ROOT / "docs" / "img" / "dashboard-overview.png"
    assert "img/dashboard-overview.png" in linked
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size < 300_000
