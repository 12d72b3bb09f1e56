"""Fixtures for the utilities' tests: nsqlookupd processes, and tools run as subprocesses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tools.helpers import ToolFactory

_TKEY = pytest.StashKey[ToolFactory]()


@pytest.fixture
def tools(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ToolFactory]:
    """``tools.start("nsq_tail", [flags])``: a tool as a subprocess; killed afterwards."""
    factory = ToolFactory(tmp_path / "tools")
    request.node.stash[_TKEY] = factory
    try:
        yield factory
    finally:
        factory.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    tf = item.stash.get(_TKEY, None)
    if tf is not None and tf.procs:
        report.sections.append(("tool output", tf.logs()))
