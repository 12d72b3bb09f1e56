"""nsqjs (node) against our nsqd: the shared suite plus nsqjs specifics.

Needs `scripts/install-test-deps.sh` (npm ci in tests/compat/js); skipped without node/nsqjs,
failed instead when CI is set. nsqjs decodes message ids as UTF-8 and refuses FIN/REQ for ids
longer than 16 bytes, so every FIN in this suite also checks our ids stay ASCII.
"""

from __future__ import annotations

import pytest
from tests.support.clients import ClientRunner, nsqjs_runner
from tests.support.compat_suite import CompatSuite, assert_ok
from tests.support.nsqd_process import NsqdProcess


class TestNsqjs(CompatSuite):
    client = "nsqjs"
    identify_msg_timeout = True

    def runner(self) -> ClientRunner:
        return nsqjs_runner()

    @pytest.mark.compat
    @pytest.mark.timeout(120)
    def test_identify_response_fields(self, nsqd: NsqdProcess) -> None:
        """nsqjs reads max_rdy_count, max_msg_timeout, msg_timeout and version."""
        res = self.publish(nsqd, self.pub_ops([b"x"]), {"msg_timeout_ms": 5000})
        assert_ok(res, 1)
        ident = res.identify[0]
        assert isinstance(ident.get("max_rdy_count"), int) and ident["max_rdy_count"] > 0
        assert isinstance(ident.get("max_msg_timeout"), int), ident
        assert ident.get("msg_timeout") == 5000, ident
        assert isinstance(ident.get("version"), str) and ident["version"], ident


class TestNsqjsWorkers2(TestNsqjs):
    """The same client against ``nsqd --workers=2`` (CompatSuite.workers: a subset)."""

    workers = 2
