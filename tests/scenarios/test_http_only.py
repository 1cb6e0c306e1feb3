"""scenarios/ reaches the product over HTTP (and processes) only: it imports none of its packages."""

from __future__ import annotations

import ast
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
PRODUCT_PACKAGES = {"engine", "gateway", "kernels", "drafts"}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_scenario_module_imports_the_product() -> None:
    files = sorted(SCENARIOS.rglob("*.py"))
    assert len(files) >= 10  # the scan sees the load scenarios too
    offenders = {str(path.relative_to(SCENARIOS)): sorted(_imported_roots(path) & PRODUCT_PACKAGES) for path in files}
    assert {name: roots for name, roots in offenders.items() if roots} == {}
