"""pynsq 0.9.1 (tornado) against our nsqd: the shared suite plus pynsq specifics.

The client runs in a subprocess (tests/compat/pynsq_scripts/client.py) so tornado's IOLoop never
touches pytest's process.
"""

from __future__ import annotations

import pytest
from tests.support.clients import ClientRunner, pynsq_runner
from tests.support.compat_suite import CompatSuite, assert_ok
from tests.support.nsqd_process import NsqdProcess


class TestPynsq(CompatSuite):
    client = "pynsq"
    identify_msg_timeout = True

    def runner(self) -> ClientRunner:
        return pynsq_runner()

    @pytest.mark.compat
    @pytest.mark.timeout(120)
    def test_identify_response_fields(self, nsqd: NsqdProcess) -> None:
        """pynsq reads max_rdy_count (falls back to 2500 with a warning if absent)."""
        res = self.publish(nsqd, self.pub_ops([b"x"]), {"msg_timeout_ms": 5000})
        assert_ok(res, 1)
        ident = res.identify[0]
        assert isinstance(ident.get("max_rdy_count"), int) and ident["max_rdy_count"] > 0
        assert ident.get("msg_timeout") == 5000, ident
        assert isinstance(ident.get("max_msg_timeout"), int), ident
        assert "setting max_rdy_count to default" not in res.stderr


class TestPynsqWorkers2(TestPynsq):
    """The same client against ``nsqd --workers=2`` (CompatSuite.workers: a subset)."""

    workers = 2
