"""Fixtures for nsqlookupd tests: real nsqlookupd processes (killed in finalizers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lookupd_process import LookupdFactory, LookupdProcess

_KEY = pytest.StashKey[LookupdFactory]()


@pytest.fixture
def lookupd_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LookupdFactory]:
    """``lookupd_factory.start([flags])``; everything is stopped/killed afterwards."""
    factory = LookupdFactory(tmp_path)
    request.node.stash[_KEY] = factory
    try:
        yield factory
    finally:
        complaints = factory.close()
    if complaints:
        pytest.fail("nsqlookupd misbehaved as a process:\n" + "\n".join(complaints),
                    pytrace=False)


@pytest.fixture(scope="module")
def shared_lookupd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LookupdProcess]:
    """One nsqlookupd for a whole module (tests use their own topic names)."""
    factory = LookupdFactory(tmp_path_factory.mktemp("lookupd"))
    proc = factory.start()
    try:
        yield proc
    finally:
        complaints = factory.close()
    assert not complaints, "\n".join(complaints)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    factory = item.stash.get(_KEY, None)
    if factory is not None and report.failed and factory.procs:
        report.sections.append(("nsqlookupd logs", factory.logs()))
