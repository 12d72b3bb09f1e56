"""An in-process nsqd for tests of node-internal jobs (retention, memory budget)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from nsqx.nsqd.node import NSQD
from nsqx.nsqd.options import parse_args


@asynccontextmanager
async def running_node(data_path: Path, *flags: str) -> AsyncIterator[NSQD]:
    """A started NSQD on free 127.0.0.1 ports over data_path, its HTTP API loaded; stopped
    on exit."""
    nsqd = NSQD(parse_args(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                            f"--data-path={data_path}", *flags]))
    await nsqd.start()
    try:
        await nsqd.http_loaded()  # nothing loads in the background while a test runs
        yield nsqd
    finally:
        await nsqd.stop()
