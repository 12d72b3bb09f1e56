"""Fixtures for nsqlookupd tests: real nsqlookupd processes (killed in finalizers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.lookupd_process import LookupdFactory, LookupdProcess


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

