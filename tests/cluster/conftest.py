"""A real etcd per test (single member on free loopback ports), stopped afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqx.cluster.etcd_server import EtcdServer


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)
