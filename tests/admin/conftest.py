"""Fixtures for nsqadmin's tests: a real cluster (nsqlookupd + nsqds) and nsqadmin processes.

Every process is killed in the fixture finalizers whatever the test did; logs are attached to
the report of a failed test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.admin.helpers import AdminFactory, NotificationSink, get_json, wait_for
from tests.support.cluster import Cluster as RealCluster
from tests.support.lookupd_process import LookupdFactory, LookupdProcess
from tests.support.nsqd_process import NsqdFactory, NsqdProcess

_AKEY = pytest.StashKey[AdminFactory]()


@pytest.fixture
def admin_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AdminFactory]:
    factory = AdminFactory(tmp_path / "admin")
    request.node.stash[_AKEY] = factory
    try:
        yield factory
    finally:
        complaints = factory.close()
    if complaints:
        pytest.fail("nsqadmin misbehaved:\n" + "\n".join(complaints), pytrace=False)


@pytest.fixture
def sink() -> Iterator[NotificationSink]:
    s = NotificationSink().start()
    try:
        yield s
    finally:
        s.close()


@dataclass
class Cluster:
    lookupd: LookupdProcess
    nsqds: list[NsqdProcess]
    admin_factory: AdminFactory
    stopped: list[int] = field(default_factory=list)

    def start_admin(self, *extra: str):  # type: ignore[no-untyped-def]
        return self.admin_factory.start(
            [f"--lookupd-http-address={self.lookupd.http_address}", "--stats-sample-interval=1s",
             "--http-client-request-timeout=2s", "--http-client-connect-timeout=1s", *extra])

    def freeze(self, nsqd: NsqdProcess) -> None:
        """SIGSTOP: the node stays registered in lookupd but answers nothing."""
        assert nsqd.pid
        os.kill(nsqd.pid, signal.SIGSTOP)
        self.stopped.append(nsqd.pid)

    def thaw(self) -> None:
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stopped.clear()


@pytest.fixture
def cluster(lookupd_factory: LookupdFactory, nsqd_factory: NsqdFactory,
            admin_factory: AdminFactory) -> Iterator[Cluster]:
    """One nsqlookupd and two nsqds registered with it (broadcast 127.0.0.1)."""
    ld = lookupd_factory.start()
    nsqds = [nsqd_factory.start([f"--lookupd-tcp-address={ld.tcp_address}",
                                 "--broadcast-address=127.0.0.1",
                                 "--e2e-processing-latency-percentile=0.99,0.5"])
             for _ in range(2)]
    wait_for(lambda: len(get_json(f"http://{ld.http_address}/nodes")["producers"]) == 2,
             15, what="both nsqds registered in lookupd")
    c = Cluster(ld, nsqds, admin_factory)
    try:
        yield c
    finally:
        c.thaw()


@pytest.fixture
def real_cluster(etcd_server: EtcdServer, nsqd_factory: NsqdFactory,
                 lookupd_factory: LookupdFactory) -> RealCluster:
    """Cluster mode: etcd + nsqlookupd (the coordinator) + three nsqd."""
    return RealCluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    af = item.stash.get(_AKEY, None)
    if af is not None and af.procs:
        report.sections.append(("nsqadmin logs", af.logs()))
