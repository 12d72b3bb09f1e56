"""``to_nsq``: publish stdin to a topic, one message per ``--delimiter``-separated record
(upstream ``apps/to_nsq``).

Each record is published to every ``--nsqd-tcp-address`` (as upstream). Empty records are
skipped; a last record without a trailing delimiter is published too. ``--rate N`` throttles
to N messages/s (a token bucket holding at most one second of credit); without it records
are sent in MPUB batches, in order. EOF or SIGINT/SIGTERM: wait for what was sent to be
acknowledged, exit 0. A publish error is fatal (exit 1).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Sequence

from nsqx.client import NSQError, Producer
from nsqx.flags import Flag
from nsqx.protocol.names import valid_topic_name

from . import common

PROG = "to_nsq"
_READ = 256 * 1024
_BATCH_COUNT = 500
_BATCH_BYTES = 512 * 1024


def flags() -> list[Flag]:
    return [
        common.version_flag(),
        Flag("topic", "string", "", "NSQ topic to publish to"),
        Flag("delimiter", "string", "\n", "character to split input from stdin",
             default_text='"\\n"'),
        common.destination_flag("nsqd-tcp-address"),
        common.producer_opt_flag(),
        Flag("rate", "int", 0, "Throttle messages to n/second. 0 to disable"),
        common.stats_interval_flag(10.0),
    ]


class TokenBucket:
    """Starts with one token, gains ``rate`` per second, holds at most ``rate``."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.tokens = 1.0
        self.last = time.monotonic()

    async def take(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(float(self.rate), self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return
            await asyncio.sleep((1.0 - self.tokens) / self.rate)


def _start_reader(queue: asyncio.Queue[bytes | None]) -> None:
    """Read stdin in a daemon thread (a blocked read() must never keep the process alive)."""
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()  # raw reads: no buffer lock held by a thread blocked in read()

    def work() -> None:
        while True:
            try:
                chunk = os.read(fd, _READ)
            except (OSError, ValueError):
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(queue.put(chunk or None), loop).result()
            except Exception:
                return
            if not chunk:
                return

    threading.Thread(target=work, name="to_nsq-stdin", daemon=True).start()


async def run(argv: Sequence[str] | None) -> int:
    opts = common.parse_flags(PROG, flags(), argv, __doc__ or "")
    common.setup_logging("warn")
    if not opts.topic:
        raise common.Fatal("--topic required")
    if not valid_topic_name(opts.topic):
        raise common.Fatal(f"--topic {opts.topic!r} is invalid")
    delim = opts.delimiter.encode("utf-8", "surrogateescape")
    if len(delim) != 1:
        raise common.Fatal("--delimiter must be a single byte")
    if not opts.nsqd_tcp_address:
        raise common.Fatal("--nsqd-tcp-address required")
    if opts.rate < 0:
        raise common.Fatal("--rate must be >= 0")
    co = common.conn_options(opts.producer_opt, consumer=False, flag="producer-opt",
                             user_agent=common.user_agent(PROG))
    producers = [Producer(a, **co.producer_kwargs())
                 for a in dict.fromkeys(opts.nsqd_tcp_address)]
    stop = common.StopSignal(PROG)
    reporter = common.RateReporter(PROG, opts.stats_interval)
    bucket = TokenBucket(opts.rate) if opts.rate >= 1 else None
    if bucket is not None:
        print(f"Throttling messages rate to max:{opts.rate}/second", file=sys.stderr)
    topic = opts.topic

    async def publish_batch(batch: list[bytes]) -> None:
        async def one(p: Producer) -> None:
            try:
                if len(batch) == 1:
                    await p.publish(topic, batch[0])
                else:
                    await p.mpublish(topic, batch)
            except NSQError as e:
                if e.code not in ("E_BAD_MESSAGE", "E_BAD_BODY") or len(batch) == 1:
                    raise
                for body in batch:  # find the record nsqd refuses (E_BAD_MESSAGE, ...)
                    await p.publish(topic, body)
        await asyncio.gather(*(one(p) for p in producers))
        reporter.add(len(batch))

    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=4)
    _start_reader(queue)
    stop_wait = asyncio.ensure_future(stop.wait())
    rest = b""
    try:
        reporter.start()
        eof = False
        while not eof and not stop.is_set():
            get = asyncio.ensure_future(queue.get())
            await asyncio.wait([get, stop_wait], return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                break
            chunk = get.result()
            if chunk is None:
                eof = True
                records = [rest] if rest else []
                rest = b""
            else:
                parts = (rest + chunk).split(delim)
                rest = parts.pop()
                records = parts
            records = [r for r in records if r]
            if bucket is not None:
                for r in records:
                    if stop.is_set():
                        break
                    await bucket.take()
                    await publish_batch([r])
                continue
            batch: list[bytes] = []
            size = 0
            for r in records:
                batch.append(r)
                size += len(r)
                if len(batch) >= _BATCH_COUNT or size >= _BATCH_BYTES:
                    await publish_batch(batch)
                    batch, size = [], 0
            if batch:
                await publish_batch(batch)
    except NSQError as e:
        raise common.Fatal(f"publish failed: {e}") from None
    finally:
        stop_wait.cancel()
        for p in producers:
            await p.close()
        await reporter.close()
    return 0


main = common.tool_main(PROG, run)


if __name__ == "__main__":
    main()
