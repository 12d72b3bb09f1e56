"""``nsq_to_nsq``: relay topics to other nsqd nodes (upstream ``apps/nsq_to_nsq``).

* Consumes every ``--topic`` on ``--channel`` and publishes each message to
  ``--destination-topic`` (default: the same topic name) on the
  ``--destination-nsqd-tcp-address`` nodes.
* ``--mode``: ``hostpool`` (the default; ``epsilon-greedy`` is an alias): one destination per
  message, round-robin over the destinations that have not failed lately; ``round-robin``: one
  destination per message in turn; ``fanout`` (nsqx): every destination gets every message,
  and the message is FINished only when all of them acknowledged it (a partial failure
  requeues it, so destinations that had succeeded may get it twice: at-least-once).
* A message is FINished once a destination acknowledged it, requeued (with backoff) if the
  publish failed.
* JSON filters: ``--require-json-field F`` passes only JSON objects with F (and with
  ``--require-json-value V``, only those where F equals V, as a string or a number; a message
  lacking F is then requeued with backoff, as upstream); ``--whitelist-json-field`` (repeatable)
  keeps only those fields. With a filter, messages that are not JSON objects are dropped.
* SIGINT/SIGTERM: stop consuming, wait for publishes in flight, exit 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nsqx.client import Message, NSQError, Producer
from nsqx.flags import Flag
from nsqx.protocol.names import valid_channel_name, valid_topic_name

from . import common
from .consuming import ConsumingTool, run_consuming
from .nsq_to_http import Destinations

PROG = "nsq_to_nsq"
log = logging.getLogger("nsqx.tools.nsq_to_nsq")


def flags() -> list[Flag]:
    return [
        common.version_flag(),
        Flag("topic", "strings", [], "nsq topic (may be given multiple times)"),
        *common.consumer_flags("nsq_to_nsq"),
        Flag("destination-topic", "string", "",
             "use this destination topic for all consumed topics (default is consumed topic "
             "name)"),
        common.destination_flag("destination-nsqd-tcp-address"),
        common.producer_opt_flag(),
        Flag("status-every", "int", 250,
             "the # of requests between logging status (per destination), 0 disables"),
        Flag("mode", "string", "hostpool",
             "the upstream request mode options: round-robin, hostpool (default), "
             "epsilon-greedy (an alias of hostpool), fanout (nsqx: publish to every "
             "destination)"),
        Flag("whitelist-json-field", "strings", [],
             "for JSON messages: pass this field (may be given multiple times)"),
        Flag("require-json-field", "string", "",
             "for JSON messages: only pass messages that contain this field"),
        Flag("require-json-value", "string", "",
             "for JSON messages: only pass messages in which the required field has this value"),
        common.stats_interval_flag(10.0),
    ]


class JSONFilter:
    """Upstream's ``shouldPassMessage`` and ``filterMessage``."""

    def __init__(self, require_field: str, require_value: str, whitelist: Sequence[str]) -> None:
        self.field = require_field
        self.value = require_value
        self.whitelist = list(whitelist)
        self.value_number: float | None = None
        if require_value:
            try:
                self.value_number = float(require_value)
            except ValueError:
                self.value_number = None

    @property
    def active(self) -> bool:
        return bool(self.field or self.whitelist)

    def should_pass(self, js: dict[str, Any]) -> tuple[bool, bool]:
        """-> (pass, backoff)."""
        if not self.field:
            return True, False
        if self.field not in js:
            if self.value:
                log.error("missing field to check required value")
                return False, True
            return False, False
        if not self.value:
            return True, False
        v = js[self.field]
        if isinstance(v, str):
            return v == self.value, False
        if self.value_number is not None and isinstance(v, int | float) \
                and not isinstance(v, bool):
            return float(v) == self.value_number, False
        return False, False

    def filter(self, js: dict[str, Any], raw: bytes) -> bytes:
        if not self.whitelist:
            return raw
        out: dict[str, Any] = {}
        for key in self.whitelist:
            if key in js:
                v = js[key]
                if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
                    v = int(v)  # as upstream: no 1.0 for integers
                out[key] = v
        # encoding/json: keys sorted, compact
        return json.dumps(out, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode()


class _Backoff(Exception):
    pass


class Batcher:
    """Publishes made in one loop turn to one producer and topic go out as one MPUB (atomic:
    every message in it succeeds or fails together); a lone message is a plain PUB."""

    MAX_COUNT = 500
    MAX_BYTES = 1 << 20

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self._pending: dict[str, list[tuple[bytes, asyncio.Future[None]]]] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def publish(self, topic: str, body: bytes) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._pending.setdefault(topic, []).append((body, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for topic, items in pending.items():
            batch: list[tuple[bytes, asyncio.Future[None]]] = []
            size = 0
            for item in items:
                if batch and (len(batch) >= self.MAX_COUNT or size + len(item[0]) > self.MAX_BYTES):
                    self._send(topic, batch)
                    batch, size = [], 0
                batch.append(item)
                size += len(item[0])
            if batch:
                self._send(topic, batch)

    def _send(self, topic: str, batch: list[tuple[bytes, asyncio.Future[None]]]) -> None:
        task = asyncio.get_running_loop().create_task(self._publish(topic, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(self, topic: str, batch: list[tuple[bytes, asyncio.Future[None]]]) -> None:
        try:
            if len(batch) == 1:
                await self.producer.publish(topic, batch[0][0])
            else:
                await self.producer.mpublish(topic, [b for b, _ in batch])
        except BaseException as e:  # noqa: BLE001 - handed to every waiter
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            if not isinstance(e, Exception):
                raise
            return
        for _, fut in batch:
            if not fut.done():
                fut.set_result(None)


class ToNSQ(ConsumingTool):
    prog = PROG

    def check(self) -> None:
        opts = self.opts
        if not opts.topic or not opts.channel:
            raise common.Fatal("--topic and --channel are required")
        for t in opts.topic:
            if not valid_topic_name(t):
                raise common.Fatal("--topic is invalid")
        if opts.destination_topic and not valid_topic_name(opts.destination_topic):
            raise common.Fatal("--destination-topic is invalid")
        if not valid_channel_name(opts.channel):
            raise common.Fatal("--channel is invalid")
        common.check_addresses(opts)
        if not opts.destination_nsqd_tcp_address:
            raise common.Fatal("--destination-nsqd-tcp-address required")
        self.mode = "hostpool" if opts.mode == "epsilon-greedy" else opts.mode
        if self.mode not in ("round-robin", "hostpool", "fanout"):
            raise common.Fatal(f"invalid --mode {opts.mode!r} (round-robin, hostpool, "
                               "epsilon-greedy, fanout)")

    def progress(self) -> str:
        return f"{self.filtered} filtered, {self.failed} failed publishes"

    async def open(self) -> None:
        opts = self.opts
        pco = common.conn_options(opts.producer_opt, consumer=False, flag="producer-opt",
                                  user_agent=common.user_agent(PROG))
        self.addresses = list(dict.fromkeys(opts.destination_nsqd_tcp_address))
        self.producers = {a: Producer(a, **pco.producer_kwargs()) for a in self.addresses}
        self.batchers = {a: Batcher(p) for a, p in self.producers.items()}
        self.dests = Destinations(self.addresses, self.mode, opts.status_every)
        self.filt = JSONFilter(opts.require_json_field, opts.require_json_value,
                               opts.whitelist_json_field)
        self.filtered = self.failed = 0

    async def close(self) -> None:
        for p in self.producers.values():
            await p.close()

    async def publish(self, addr: str, topic: str, body: bytes, start: float) -> None:
        try:
            await self.batchers[addr].publish(topic, body)
        except NSQError as e:
            self.failed += 1
            self.dests.failed(addr)
            raise RuntimeError(f"publish to {addr} failed: {e}") from e
        self.dests.done(addr, start)

    def filter(self, body: bytes) -> bytes | None:
        """The JSON filters: the body to relay, None to drop it; _Backoff to requeue it."""
        filt = self.filt
        try:
            js = json.loads(body)
        except ValueError:
            js = None
        if not isinstance(js, dict):
            log.error("Unable to decode json: %r", body[:200])
            return None
        ok, backoff = filt.should_pass(js)
        if not ok:
            if backoff:
                raise _Backoff("backoff")
            return None
        return filt.filter(js, body)

    def handler_for(self, topic: str) -> Callable[[Message], Awaitable[None]]:
        dest_topic = self.opts.destination_topic or topic

        async def handle(msg: Message) -> None:
            body = msg.body
            if self.filt.active:
                kept = self.filter(body)
                if kept is None:
                    self.filtered += 1
                    return
                body = kept
            start = time.monotonic()
            if self.mode == "fanout":
                results = await asyncio.gather(
                    *(self.publish(a, dest_topic, body, start) for a in self.addresses),
                    return_exceptions=True)
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:
                    raise errors[0]
            else:
                await self.publish(self.dests.pick(), dest_topic, body, start)
            self.dests.aggregate.status(start)
            self.reporter.add()

        return handle


async def run(argv: Sequence[str] | None) -> int:
    return await run_consuming(ToNSQ, flags(), argv, __doc__ or "")


main = common.tool_main(PROG, run)


if __name__ == "__main__":
    main()
