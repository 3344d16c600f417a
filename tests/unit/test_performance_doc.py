"""docs/performance.md's figures are bench/RESULTS.md's, rendered by bench/figures.py (never
retyped)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "bench" / "figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


figures = _figures()

RESULTS = """# Benchmark results

Written by `make bench` (bench/run_all.py) on 2026-01-02 03:04 UTC; machine: a box, 2 cores.

| benchmark | figure | value | target | result |
|-----------|--------|-------|--------|--------|
| Status tracking on vs off | throughput ratio on/off | 0.581 |  |  |
| Status tracking on vs off | extra DynamoDB requests per message | 0.128 | ≤ 0.3 | met |
| CDK synth time | 10 channels (s) | 2.29 |  |  |

## Raw output
"""
PAGE = f"# Performance\n\nintro\n\n{figures.BEGIN}\nold\n{figures.END}\n\noutro\n"


def test_the_committed_page_is_current_with_results_md() -> None:
    # `make bench` rewrites RESULTS.md and renders the page; a RESULTS.md committed alone fails
    check = subprocess.run([sys.executable, str(ROOT / "bench" / "figures.py"), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr


def test_every_headline_figure_of_results_md_is_on_the_page() -> None:
    run, rows = figures.read_results((ROOT / "bench" / "RESULTS.md").read_text())
    page = (ROOT / "docs" / "performance.md").read_text()
    block = page[page.index(figures.BEGIN): page.index(figures.END)]
    assert run.removeprefix("Written by ").rstrip(".") in block
    assert len(rows) >= 20
    for row in rows:
        assert f"| {row.figure} | {row.value} | {row.target} | {row.result} |" in block, row


def test_the_block_is_rendered_from_the_results_and_the_rest_is_kept() -> None:
    run, rows = figures.read_results(RESULTS)
    page = figures.updated_page(PAGE, figures.render(run, rows))
    assert page.startswith("# Performance\n\nintro\n\n") and page.endswith("\n\noutro\n")
    assert "old" not in page
    assert "on 2026-01-02 03:04 UTC; machine: a box, 2 cores" in page
    assert "**Status tracking on vs off**" in page and "**CDK synth time**" in page
    assert "| throughput ratio on/off | 0.581 |  |  |" in page
    assert "| extra DynamoDB requests per message | 0.128 | ≤ 0.3 | met |" in page
    # A changed figure in RESULTS.md changes the page: the check cannot pass a stale page
    changed = figures.render(*figures.read_results(RESULTS.replace("0.581", "0.93")))
    assert figures.updated_page(PAGE, changed) != page


@pytest.mark.parametrize(("text", "names"), [
    ("# Benchmark results\n\n| benchmark | figure | value | target | result |\n", "Written by"),
    ("Written by x on y.\n\nno table\n", "headline table"),
    ("Written by x on y.\n\n| benchmark | figure | value | target | result |\n|--|\n", "empty"),
])
def test_a_results_file_that_is_not_run_alls_is_refused_naming_what_is_missing(
    text: str, names: str,
) -> None:
    with pytest.raises(ValueError, match=names):
        figures.read_results(text)


def test_a_page_without_exactly_one_block_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly one figures block"):
        figures.updated_page("# Performance\n", "block")
