"""Which implementation of the per-message MPUB loops runs: nsqx._speedups (C) when it
was built, else the pure-Python twins. ``NSQX_NO_SPEEDUPS=1`` forces the twins (the
tests run both and compare)."""

from __future__ import annotations

import os
from types import ModuleType

native: ModuleType | None = None
if not os.environ.get("NSQX_NO_SPEEDUPS"):
    try:
        from nsqx import _speedups as native
    except ImportError:  # not built (no compiler at install): the twins are used
        native = None
