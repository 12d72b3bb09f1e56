"""Durable whole-file replacement shared by the storage files written in one piece."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "write_durably"]


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes, tmp: Path | None = None) -> None:
    """tmp + fsync + rename + directory fsync (the file is whole or the old one); OSError
    from any step. ``tmp`` defaults to ``path`` + ".tmp" (pass a unique one for concurrent
    writers)."""
    tmp = path.with_name(path.name + ".tmp") if tmp is None else tmp
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
