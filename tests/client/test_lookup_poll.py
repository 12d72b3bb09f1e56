"""LookupdPoller at start: a topic lookupd does not know yet is asked again soon (not a
poll interval later), and each lookupd's answer is logged once, not every round."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from nsqx.client.lookup import LookupdPoller
from tests.client.helpers import run


async def fake_lookupd(unknown_rounds: int) -> tuple[web.AppRunner, str, list[int]]:
    """A lookupd answering 404 (topic not found) ``unknown_rounds`` times, then one nsqd."""
    calls: list[int] = []

    async def lookup(request: web.Request) -> web.Response:
        calls.append(1)
        if len(calls) <= unknown_rounds:
            return web.json_response({"message": "TOPIC_NOT_FOUND"}, status=404)
        return web.json_response({"channels": [], "producers": [
            {"broadcast_address": "127.0.0.1", "tcp_port": 4150, "http_port": 4151}]})

    app = web.Application()
    app.router.add_get("/lookup", lookup)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}", calls


def test_unknown_topic_is_asked_again_soon_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        runner, addr, calls = await fake_lookupd(unknown_rounds=2)
        seen: list[set[str]] = []
        found = asyncio.Event()

        def on_producers(producers: set[str]) -> None:
            seen.append(producers)
            if producers:
                found.set()

        poller = LookupdPoller([addr], "t", on_producers, interval=60.0)
        try:
            assert await poller.poll_once() == set()
            poller.start(polled=True)
            async with asyncio.timeout(30):  # the next poll interval would be 60-78 s away
                await found.wait()
        finally:
            await poller.close()
            await runner.cleanup()
        assert len(calls) == 3 and seen[-1] == {"127.0.0.1:4150"}

    with caplog.at_level(logging.INFO, logger="nsqx.client"):
        run(main())
    told = [r.getMessage() for r in caplog.records if r.name == "nsqx.client"]
    assert sum("no nsqd has topic t yet" in m for m in told) == 1, told
    assert sum("topic t is on 127.0.0.1:4150" in m for m in told) == 1, told


def test_retries_double_up_to_the_interval() -> None:
    poller = LookupdPoller(["127.0.0.1:1"], "t", lambda p: None, interval=5.0)
    poller.found = set()
    retry = None
    waits = []
    for _ in range(6):
        wait, retry = poller.next_wait(retry)
        waits.append(wait)
    assert 0.8 <= waits[0] <= 1.2 and 1.6 <= waits[1] <= 2.4
    assert all(4.0 <= w <= 6.0 for w in waits[3:])
    poller.found = {"127.0.0.1:4150"}
    assert poller.next_wait(retry) == (5.0, None)
