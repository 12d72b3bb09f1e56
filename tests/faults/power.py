"""Power loss of a node, LazyFS's model: data written but not fsynced is gone afterwards.

``powershim.c``, LD_PRELOADed into nsqd, journals the bytes each write to the data directory
overwrote and every fsync/fdatasync/syncfs; :func:`lose_unsynced` (called after kill -9, the
instant the power went) undoes, newest first, every write no later sync of its file covered.
File metadata (creation, rename, unlink) survives, as in LazyFS. The journal lives outside
the data directory and is removed once replayed.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("powershim.c")


def build_shim(out_dir: Path) -> Path | None:
    """The shared object, or None when it cannot be built here (no C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = out_dir / "powershim.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE), "-ldl",
                        "-lpthread"], capture_output=True, text=True)
    return out if r.returncode == 0 else None


def env(shim: Path, data_dir: Path, journal: Path) -> dict[str, str]:
    """The environment that makes a process journal its writes under ``data_dir``."""
    return {"LD_PRELOAD": str(shim), "NSQX_POWER_DIR": str(data_dir.resolve()),
            "NSQX_POWER_JOURNAL": str(journal)}


@dataclass
class Undo:
    path: str
    offset: int
    size_before: int
    old: bytes


@dataclass
class Report:
    undone_writes: int = 0
    undone_bytes: int = 0
    files: int = 0


def _parse(raw: bytes) -> list[tuple]:
    out: list[tuple] = []
    pos = 0

    def s() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        v = raw[pos:pos + n].decode()
        pos += n
        return v

    def q() -> int:
        nonlocal pos
        (v,) = struct.unpack_from("<Q", raw, pos)
        pos += 8
        return v

    while pos < len(raw):
        kind = chr(raw[pos])
        pos += 1
        if kind in "WT":
            path, off = s(), q()
            if kind == "W":
                q()  # length written: the old bytes and size say what to restore
            size, oldlen = q(), q()
            out.append((kind, Undo(path, off, size, raw[pos:pos + oldlen])))
            pos += oldlen
        elif kind in "SU":
            out.append((kind, s()))
        elif kind == "R":
            out.append((kind, s(), s()))
        elif kind == "A":
            out.append((kind,))
        else:
            raise ValueError(f"bad journal record {kind!r} at byte {pos - 1}")
    return out


def lose_unsynced(journal: Path) -> Report:
    """Undo every write the journal shows unsynced at its end (the process must be dead)."""
    pending: dict[str, list[Undo]] = {}
    for rec in _parse(journal.read_bytes()) if journal.exists() else []:
        kind = rec[0]
        if kind in "WT":
            pending.setdefault(rec[1].path, []).append(rec[1])
        elif kind == "S":
            pending.pop(rec[1], None)
        elif kind == "A":
            pending.clear()
        elif kind == "U":
            pending.pop(rec[1], None)
        elif kind == "R":
            moved = pending.pop(rec[1], [])
            pending.pop(rec[2], None)
            if moved:
                for u in moved:
                    u.path = rec[2]
                pending[rec[2]] = moved
    report = Report(files=len(pending))
    for path, undos in pending.items():
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            continue
        try:
            for u in reversed(undos):
                if u.old:
                    os.pwrite(fd, u.old, u.offset)
                if os.fstat(fd).st_size > u.size_before:
                    os.ftruncate(fd, u.size_before)
                report.undone_writes += 1
                report.undone_bytes += len(u.old)
        finally:
            os.close(fd)
    journal.unlink(missing_ok=True)
    return report
