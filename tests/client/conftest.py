"""Fixtures for client tests."""

from __future__ import annotations

import pytest

from tests.support.nsqd_process import NsqdFactory, NsqdProcess


@pytest.fixture
def two_nsqd(nsqd_factory: NsqdFactory) -> list[NsqdProcess]:
    return [nsqd_factory.start(), nsqd_factory.start()]
