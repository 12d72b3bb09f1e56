"""A wall clock the fault suite shifts per node: ``clockshim.c`` LD_PRELOADed into nsqd.

:func:`build_shim` compiles it once per run (None where no C compiler: the clock nemeses are
then left out, saying why); :class:`NodeClock` is one node's offset file.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("clockshim.c")


def build_shim(out_dir: Path) -> Path | None:
    """The shared object, or None when it cannot be built here."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = out_dir / "clockshim.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE), "-ldl"],
                       capture_output=True, text=True)
    return out if r.returncode == 0 else None


class NodeClock:
    """One node's wall-clock offset (the shim rereads the file at most every 50 ms)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set(0.0)

    def set(self, seconds: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{int(seconds * 1e9)}\n")
        tmp.replace(self.path)  # the shim never reads half a number
