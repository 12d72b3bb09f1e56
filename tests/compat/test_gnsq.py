"""gnsq 1.0.2 (gevent) against our nsqd: the shared suite plus gnsq's HTTP client.

gnsq runs in a subprocess (tests/compat/gnsq_scripts/client.py) so gevent's monkeypatching never
touches pytest. gnsq cannot send IDENTIFY msg_timeout, so timeout tests start nsqd with
--msg-timeout=1s instead.
"""

from __future__ import annotations

from collections import Counter

import pytest
from tests.support.clients import ClientRunner, gnsq_runner
from tests.support.compat_suite import BINARY_BODY, CompatSuite, assert_clean, assert_ok
from tests.support.nsqd_process import NsqdProcess


class TestGnsq(CompatSuite):
    client = "gnsq"
    identify_msg_timeout = False

    def runner(self) -> ClientRunner:
        return gnsq_runner()

    @pytest.mark.compat
    @pytest.mark.timeout(120)
    def test_gnsq_http_client_publish(self, nsqd: NsqdProcess) -> None:
        """gnsq.NsqdHTTPClient: /pub, /pub?defer, /mpub text and binary; consumed over TCP."""
        ops = [
            {"op": "http_pub", "topic": self.topic, "body": b"h-1".hex()},
            {"op": "http_pub", "topic": self.topic, "body": b"h-deferred".hex(), "delay_ms": 1500},
            {"op": "http_mpub", "topic": self.topic, "bodies": [b"h-2".hex(), b"h-3".hex()]},
            {"op": "http_mpub", "topic": self.topic, "binary": True,
             "bodies": [b"h\nbin".hex(), BINARY_BODY.hex()]},
        ]
        res = self.runner().run("publish", {"nsqd": nsqd.tcp_address,
                                            "nsqd_http": nsqd.http_address, "ops": ops})
        assert_ok(res, 4)
        expected = [b"h-1", b"h-deferred", b"h-2", b"h-3", b"h\nbin", BINARY_BODY]
        sub = self.consume(nsqd, expect=len(expected), idle_s=1.0)
        assert_clean(sub)
        assert Counter(sub.bodies()) == Counter(expected), sub.describe()
        deferred = next(d for d in sub.deliveries if d.body == b"h-deferred")
        assert (deferred.recv_ns - deferred.timestamp_ns) / 1e6 >= 900, sub.describe()


class TestGnsqWorkers2(TestGnsq):
    """The same client against ``nsqd --workers=2`` (CompatSuite.workers: a subset)."""

    workers = 2
