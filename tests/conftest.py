"""Shared fixtures: real nsqd processes, TLS files, an auth server.

Fixtures that start processes clean them up in their finalizers, whatever the test did; when a test
fails, the logs of every nsqd it started are attached to the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.support.auth_server import AuthServer
from tests.support.certs import TLSFiles, make_tls_files
from tests.support.lookupd_process import LookupdFactory
from tests.support.nsqd_process import NsqdFactory, NsqdProcess

_FACTORY_KEY = pytest.StashKey[NsqdFactory]()
_LOOKUPD_KEY = pytest.StashKey[LookupdFactory]()


@pytest.fixture
def nsqd_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NsqdFactory]:
    """Start nsqd processes with ``nsqd_factory.start([flags])``; all are killed afterwards."""
    factory = NsqdFactory(tmp_path)
    request.node.stash[_FACTORY_KEY] = factory
    try:
        yield factory
    finally:
        complaints = factory.close()
    if complaints:
        pytest.fail("nsqd misbehaved as a process:\n" + "\n".join(complaints), pytrace=False)


@pytest.fixture
def nsqd(nsqd_factory: NsqdFactory) -> NsqdProcess:
    """One nsqd with default flags on a fresh data directory."""
    return nsqd_factory.start()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A CA, a server cert for 127.0.0.1/localhost and a client cert, made once per session."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def auth_server() -> Iterator[AuthServer]:
    """An upstream-contract auth server (``--auth-http-address``); add identities per test."""
    server = AuthServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def lookupd_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LookupdFactory]:
    """Start nsqlookupd processes with ``lookupd_factory.start([flags])``; all are killed afterwards."""
    factory = LookupdFactory(tmp_path / "lookupd")
    request.node.stash[_LOOKUPD_KEY] = factory
    try:
        yield factory
    finally:
        complaints = factory.close()
    if complaints:
        pytest.fail("nsqlookupd misbehaved as a process:\n" + "\n".join(complaints),
                    pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    factory = item.stash.get(_FACTORY_KEY, None)
    if factory is not None and factory.procs:
        report.sections.append(("nsqd logs", factory.logs()))
    lookupds = item.stash.get(_LOOKUPD_KEY, None)
    if lookupds is not None and lookupds.procs:
        report.sections.append(("nsqlookupd logs", lookupds.logs()))


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    """A real etcd (single member on free loopback ports), stopped afterwards."""
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)
