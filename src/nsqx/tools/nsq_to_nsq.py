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
from collections.abc import Sequence
from typing import Any

from nsqx.client import Message, NSQError, Producer
from nsqx.flags import Flag
from nsqx.protocol.names import valid_channel_name, valid_topic_name

from . import common
from .nsq_to_http import HostPool

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


async def run(argv: Sequence[str] | None) -> int:
    opts = common.parse_flags(PROG, flags(), argv, __doc__ or "")
    common.setup_logging("warn")
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
    mode = opts.mode
    if mode == "epsilon-greedy":
        mode = "hostpool"
    if mode not in ("round-robin", "hostpool", "fanout"):
        raise common.Fatal(f"invalid --mode {opts.mode!r} (round-robin, hostpool, epsilon-greedy, "
                           "fanout)")
    ua = common.user_agent(PROG)
    cco = common.conn_options(opts.consumer_opt, consumer=True, flag="consumer-opt", user_agent=ua)
    pco = common.conn_options(opts.producer_opt, consumer=False, flag="producer-opt", user_agent=ua)
    ckwargs = cco.consumer_kwargs()
    ckwargs.pop("max_in_flight", None)

    dests = list(dict.fromkeys(opts.destination_nsqd_tcp_address))
    producers = {a: Producer(a, **pco.producer_kwargs()) for a in dests}
    batchers = {a: Batcher(p) for a, p in producers.items()}
    pool = HostPool(dests)
    counter = 0
    per_address = {a: common.TimerMetrics(opts.status_every if len(dests) > 1 else 0, f"[{a}]:")
                   for a in dests}
    aggregate = common.TimerMetrics(opts.status_every, "[aggregate]:")
    filt = JSONFilter(opts.require_json_field, opts.require_json_value,
                      opts.whitelist_json_field)
    reporter = common.RateReporter(PROG, opts.stats_interval)
    counts = {"filtered": 0, "failed": 0}
    reporter.extra = lambda: f"{counts['filtered']} filtered, {counts['failed']} failed publishes"

    async def publish(addr: str, topic: str, body: bytes, start: float) -> None:
        try:
            await batchers[addr].publish(topic, body)
        except NSQError as e:
            counts["failed"] += 1
            if mode == "hostpool":
                pool.mark(addr, False)
            raise RuntimeError(f"publish to {addr} failed: {e}") from e
        if mode == "hostpool":
            pool.mark(addr, True)
        per_address[addr].status(start)

    def make_handler(dest_topic: str):  # noqa: ANN202
        async def handle(msg: Message) -> None:
            nonlocal counter
            body = msg.body
            if filt.active:
                try:
                    js = json.loads(body)
                except ValueError:
                    js = None
                if not isinstance(js, dict):
                    log.error("Unable to decode json: %r", body[:200])
                    counts["filtered"] += 1
                    return
                ok, backoff = filt.should_pass(js)
                if not ok:
                    if backoff:
                        raise _Backoff("backoff")
                    counts["filtered"] += 1
                    return
                body = filt.filter(js, body)
            start = time.monotonic()
            if mode == "fanout":
                results = await asyncio.gather(
                    *(publish(a, dest_topic, body, start) for a in dests),
                    return_exceptions=True)
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:
                    raise errors[0]
            else:
                if mode == "round-robin":
                    counter += 1
                    addr = dests[counter % len(dests)]
                else:
                    addr = pool.get()
                await publish(addr, dest_topic, body, start)
            aggregate.status(start)
            reporter.add()

        return handle

    stop = common.StopSignal(PROG)
    try:
        await common.consume_until_stopped(
            opts, opts.topic, lambda t: make_handler(opts.destination_topic or t), stop,
            reporter, ckwargs)
    finally:
        for p in producers.values():
            await p.close()
    return 0


main = common.tool_main(PROG, run)


if __name__ == "__main__":
    main()
