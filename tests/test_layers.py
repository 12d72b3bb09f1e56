"""The layer contracts of docs/architecture.md (``[tool.importlinter]`` in pyproject.toml)
hold: ``lint-imports`` finds no import pointing upward and none between sibling packages
that must stay independent. scripts/test.sh runs it too; this makes a plain pytest run fail
the same way."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_layers_are_kept() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def _contracts() -> list[dict[str, object]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["tool"]["importlinter"]["contracts"]


def _names(layers: list[str]) -> set[str]:
    return {n.strip() for layer in layers for n in layer.split("|")}


def test_contracts_cover_every_package_and_module() -> None:
    """A package or nsqd module missing from the contracts is unchecked: its imports could
    point anywhere without lint-imports saying so."""
    src = ROOT / "src" / "nsqx"
    contracts = _contracts()
    top = next(c for c in contracts if "containers" not in c and c["type"] == "layers")
    shared = next(c for c in contracts if c["type"] == "forbidden")
    covered = _names(top["layers"]) | set(shared["source_modules"])  # type: ignore[arg-type]
    packages = {f"nsqx.{p.name}" for p in src.iterdir() if (p / "__init__.py").exists()}
    modules = {f"nsqx.{p.stem}" for p in src.glob("*.py") if p.stem != "__init__"}
    assert packages - covered == set()
    assert modules - covered == set()
    nsqd = next(c for c in contracts if c.get("containers") == ["nsqx.nsqd"])
    nsqd_modules = {p.stem for p in (src / "nsqd").glob("*.py") if p.stem != "__init__"}
    assert nsqd_modules - _names(nsqd["layers"]) == set()  # type: ignore[arg-type]
