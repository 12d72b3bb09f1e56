"""nsqx.client's Consumer(start=...): SUB_ADVANCED replays a new channel from a position."""

from __future__ import annotations

import asyncio

import pytest

from nsqx.client import Consumer, Producer
from tests.client.helpers import run, wait_for
from tests.support.nsqd_process import NsqdProcess


def test_consumer_starts_a_new_channel_at_a_position(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        async with Producer(nsqd.tcp_address) as p:
            await p.mpublish("rp", [b"m%d" % i for i in range(6)])
        got: list[bytes] = []
        first = Consumer("rp", "from4", lambda m: got.append(m.body),
                         nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=10,
                         start="msgcount:4")
        async with first:
            await wait_for(lambda: len(got) == 2)
            assert got == [b"m4", b"m5"]
            # a second client of the channel joins where it is: its position is not applied
            async with Consumer("rp", "from4", lambda m: got.append(m.body),
                                nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=10,
                                start="earliest"):
                async with Producer(nsqd.tcp_address) as p:
                    await p.publish("rp", b"m6")
                await wait_for(lambda: len(got) == 3)
                await asyncio.sleep(0.3)
                assert got == [b"m4", b"m5", b"m6"]
        # no client left: the next first client's position applies again
        got.clear()
        async with Consumer("rp", "from4", lambda m: got.append(m.body),
                            nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=10,
                            start="msgcount:5"):
            await wait_for(lambda: len(got) == 2)
        assert got == [b"m5", b"m6"]

    run(main())


@pytest.mark.parametrize("start", ["", "tomorrow", "msgcount:-1", "timestamp:x"])
def test_bad_start_positions_are_refused_early(start: str) -> None:
    with pytest.raises(ValueError, match="invalid start position"):
        Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:1", start=start)
