"""One way to write install commands (issue 30, item 7): the docs' clone form, extras named
as pyproject.toml names them, and error messages built by :func:`nsqx.extras.install_command`
for the Python that runs."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from nsqx import extras
from nsqx.extras import install_command

ROOT = Path(__file__).resolve().parent.parent
DECLARED = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
               ["optional-dependencies"])
# the docs' form: `.venv/bin/pip install -e '.[EXTRA]'` (or `-e .`); for another Python
# (Spark's workers) `PYTHON -m pip install -e '.[EXTRA]'`
DOC_FORM = re.compile(r"(\.venv/bin/pip|PYTHON -m pip) install -e\s+(\.(?=[\s`]|$)|'\.\[(\w+)\]')")


def test_extras_are_the_declared_ones() -> None:
    assert set(extras.EXTRAS) | {"test"} == DECLARED


def _mentions() -> list[tuple[str, str]]:
    """(file:line, text from `pip install` on) across README, docs (design notes aside:
    they record history) and the source."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "src").rglob("*.py"))]
    out = []
    for f in files:
        if f.name == "design-notes.md" or f.name == "extras.py":
            continue
        text = f.read_text()
        for m in re.finditer(r"\S*(?:\s+-m)?\s+pip\s+install", text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{f.relative_to(ROOT)}:{line}",
                        text[m.start():m.start() + 80].replace("\n", " ")))
    return out


def test_docs_and_messages_write_install_commands_one_way() -> None:
    found = _mentions()
    assert found, "no install command found: the scan is broken"
    bad = []
    for where, text in found:
        m = DOC_FORM.match(text.lstrip("`('\""))
        if m is None or m.group(3) is not None and m.group(3) not in DECLARED:
            bad.append(f"{where}: {text}")
    assert bad == []


def test_install_command_in_the_clone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    pip = Path(sys.prefix) / "bin" / "pip"
    want = pip.relative_to(ROOT) if pip.is_relative_to(ROOT) else pip
    assert install_command("cluster") == f"{want} install -e '.[cluster]'"
    if Path(sys.prefix) == ROOT / ".venv":  # what README's reader runs
        assert install_command("cluster") == ".venv/bin/pip install -e '.[cluster]'"
    assert install_command("spark", "/usr/bin/python3") == \
        "/usr/bin/python3 -m pip install -e '.[spark]'"


def test_install_command_elsewhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    cmd = install_command("archive")
    assert cmd.endswith(f" install -e '{ROOT}[archive]'") and cmd.split()[0].startswith("/")
    monkeypatch.setattr(extras, "_CLONE", tmp_path)  # installed from a wheel, no clone
    assert install_command("archive").endswith(" install 'nsqx[archive]'")
