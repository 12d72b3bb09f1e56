"""The layer contracts of docs/architecture.md (``[tool.importlinter]`` in pyproject.toml)
hold: ``lint-imports`` finds no import pointing upward and none between sibling packages
that must stay independent. scripts/test.sh runs it too; this makes a plain pytest run fail
the same way."""

from __future__ import annotations

import shutil
import subprocess
import sys
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
