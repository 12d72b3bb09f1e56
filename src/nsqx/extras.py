"""The one command that installs an optional extra, for every error message that needs one.

The extras are pyproject.toml's: ``cluster`` (etcd), ``archive`` (pyarrow, numpy), ``spark``.
Docs write the clone form, ``.venv/bin/pip install -e '.[cluster]'``; a message says the
command for the Python that is running, so that pasting it installs into the right place.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

__all__ = ["EXTRAS", "install_command"]

EXTRAS = ("cluster", "archive", "spark")

# src/nsqx/extras.py -> the clone's root, when nsqx runs from a clone (pip install -e)
_CLONE = Path(__file__).resolve().parent.parent.parent


def _in_clone() -> bool:
    return (_CLONE / "pyproject.toml").is_file() and (_CLONE / "src" / "nsqx").is_dir()


def _short(path: Path) -> str:
    """``path`` relative to the working directory when under it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def install_command(extra: str, python: str | None = None) -> str:
    """``.venv/bin/pip install -e '.[extra]'`` in a clone's directory, the same with the
    venv's and the clone's paths elsewhere, ``pip install 'nsqx[extra]'`` outside a clone;
    ``python``: for that interpreter instead of the running one (``python -m pip ...``)."""
    assert extra in EXTRAS, extra
    pip = Path(sys.prefix) / "bin" / "pip"
    if python is not None:
        runner = f"{shlex.quote(python)} -m pip"
    elif pip.exists():
        runner = _short(pip)
        runner = runner if "/" in runner else f"./{runner}"
    else:
        runner = f"{shlex.quote(sys.executable)} -m pip"
    if _in_clone():
        target = "." if Path.cwd() == _CLONE else _short(_CLONE)
        return f"{runner} install -e {shlex.quote(f'{target}[{extra}]')}"
    return f"{runner} install {shlex.quote(f'nsqx[{extra}]')}"
