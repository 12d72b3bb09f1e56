"""Fixtures of the fault suite: a :class:`Net` of namespaces, gone after the test."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.hosts import HostCluster
from tests.faults.netns import Net, unavailable_reason

_REASON: list[str | None] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Keep the call phase's report on the item: the fixture prints logs when it failed."""
    outcome = yield
    if call.when == "call":
        item.rep_call = outcome.get_result()  # type: ignore[attr-defined]


@pytest.fixture
def net() -> Iterator[Net]:
    """The namespaces of this test (skips with the reason where they cannot be made)."""
    if not _REASON:
        _REASON.append(unavailable_reason())
    if _REASON[0]:
        pytest.skip(f"fault suite needs network namespaces: {_REASON[0]}")
    with Net(f"{os.getpid() % 100000}") as n:
        yield n


@pytest.fixture
def host_cluster(net: Net, tmp_path: Path, request: pytest.FixtureRequest
                 ) -> Iterator[HostCluster]:
    """etcd, nsqlookupd and three nsqd on their own hosts, started; logs shown on failure."""
    cluster = HostCluster(net, tmp_path).start()
    yield cluster
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for n in [cluster.lookupd, *cluster.nodes]:
            print(f"--- {n.name} ---\n{n.logs()[-4000:]}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of this test's own (a test grows it with ``mount -o remount,size=``); unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path = tmp_path / "disk"
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)

