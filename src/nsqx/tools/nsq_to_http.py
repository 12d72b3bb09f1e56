"""``nsq_to_http``: make an HTTP request for every message of a topic (upstream
``apps/nsq_to_http``).

* ``--post URL`` (the body is the message) or ``--get URL`` (``%s`` is replaced by the
  URL-escaped message); both repeatable, not together.
* ``--mode``: ``round-robin`` (each message to the next address), ``hostpool`` (the default;
  epsilon-greedy is an alias): round-robin over the addresses that have not failed lately; an
  address that fails is skipped for 30 s, doubling up to 15 min while it keeps failing.
* A 2xx answer FINishes the message; anything else (another status, a timeout, a refused
  connection) requeues it, with the consumer's backoff.
* ``-n`` requests at most in parallel; ``--sample`` publishes only that fraction of messages
  (the others are FINished); ``--status-every`` prints latency percentiles every N requests.
* SIGINT/SIGTERM: stop consuming, let running requests finish (or requeue), exit 0.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import quote_plus

import aiohttp

from nsqx import NSQ_VERSION
from nsqx.client import Message
from nsqx.flags import Flag
from nsqx.protocol.names import valid_channel_name, valid_topic_name

from . import common
from .consuming import ConsumingTool, run_consuming

PROG = "nsq_to_http"
_DEFAULT_CONTENT_TYPE = "application/octet-stream"


def flags() -> list[Flag]:
    return [
        common.version_flag(),
        Flag("topic", "string", "", "nsq topic"),
        *common.consumer_flags("nsq_to_http"),
        Flag("n", "int", 100, "number of concurrent publishers"),
        Flag("mode", "string", "hostpool",
             "the upstream request mode options: round-robin, hostpool (default), "
             "epsilon-greedy (an alias of hostpool)"),
        Flag("sample", "float", 1.0, "% of messages to publish (float b/w 0 -> 1)"),
        *common.http_client_flags(2.0, 20.0),
        Flag("status-every", "int", 250,
             "the # of requests between logging status (per handler), 0 disables"),
        Flag("content-type", "string", _DEFAULT_CONTENT_TYPE,
             "the Content-Type used for POST requests"),
        Flag("post", "strings", [],
             "HTTP address to make a POST request to.  data will be in the body (may be given "
             "multiple times)"),
        Flag("header", "strings", [],
             "Custom header for HTTP requests, as 'key:value' (may be given multiple times)"),
        Flag("get", "strings", [],
             "HTTP address to make a GET request to. '%s' will be printf replaced with data "
             "(may be given multiple times)"),
        common.stats_interval_flag(10.0),
    ]


class HostPool:
    """go-hostpool's standard pool: round-robin over live hosts; a failed host is retried
    after 30 s, doubling to 900 s; when every host is dead all are revived."""

    INITIAL = 30.0
    MAX = 900.0

    def __init__(self, hosts: Sequence[str]) -> None:
        self.hosts = list(hosts)
        self.next = 0
        self.dead_until: dict[str, float] = {}
        self.delay: dict[str, float] = {}

    def get(self) -> str:
        now = time.monotonic()
        n = len(self.hosts)
        for i in range(n):
            h = self.hosts[(self.next + i) % n]
            if self.dead_until.get(h, 0.0) <= now:
                self.next = (self.next + i + 1) % n
                return h
        self.dead_until.clear()  # all dead: try them all again
        h = self.hosts[self.next % n]
        self.next = (self.next + 1) % n
        return h

    def mark(self, host: str, ok: bool) -> None:
        if ok:
            self.dead_until.pop(host, None)
            self.delay.pop(host, None)
            return
        d = min(self.delay.get(host, self.INITIAL / 2) * 2, self.MAX)
        self.delay[host] = d
        self.dead_until[host] = time.monotonic() + d


_PRINTF = re.compile(r"%[%s]")


def get_url(template: str, body: bytes) -> str:
    """Go's ``fmt.Sprintf(template, url.QueryEscape(body))`` for a template with one %s."""
    value = quote_plus(body)
    return _PRINTF.sub(lambda m: "%" if m.group(0) == "%%" else value, template)


def parse_headers(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for s in items:
        key, sep, val = s.partition(":")
        key, val = key.strip(), val.strip()
        if not sep or not key or not val:
            raise common.Fatal("--header value format should be 'key:value'")
        out[key] = val
    return out


class Destinations:
    """Where each message goes (nsq_to_http, nsq_to_nsq): ``round-robin``, the next address
    in turn; ``hostpool``/``epsilon-greedy``, the :class:`HostPool` (an address that failed
    lately is skipped). Also the latency lines of ``--status-every``, per address (with more
    than one) and in aggregate."""

    def __init__(self, addresses: Sequence[str], mode: str, status_every: int) -> None:
        self.addresses = list(addresses)
        self.hostpool = mode in ("hostpool", "epsilon-greedy")
        self.pool = HostPool(self.addresses)
        self.counter = 0
        self.per_address = {
            a: common.TimerMetrics(status_every if len(self.addresses) > 1 else 0, f"[{a}]:")
            for a in self.addresses}
        self.aggregate = common.TimerMetrics(status_every, "[aggregate]:")

    def pick(self) -> str:
        if not self.hostpool:
            self.counter += 1
            return self.addresses[self.counter % len(self.addresses)]
        return self.pool.get()

    def failed(self, addr: str) -> None:
        if self.hostpool:
            self.pool.mark(addr, False)

    def done(self, addr: str, start: float) -> None:
        """``addr`` answered a request made at ``start`` (time.monotonic())."""
        if self.hostpool:
            self.pool.mark(addr, True)
        self.per_address[addr].status(start)


class ToHTTP(ConsumingTool):
    prog = PROG

    def check(self) -> None:
        opts = self.opts
        self.headers = parse_headers(opts.header)
        if not opts.topic or not opts.channel:
            raise common.Fatal("--topic and --channel are required")
        if not valid_topic_name(opts.topic):
            raise common.Fatal("--topic is invalid")
        if not valid_channel_name(opts.channel):
            raise common.Fatal("--channel is invalid")
        if opts.content_type != _DEFAULT_CONTENT_TYPE:
            if not opts.post:
                raise common.Fatal("--content-type only used with --post")
            if not opts.content_type:
                raise common.Fatal("--content-type requires a value when used")
        common.check_addresses(opts)
        if not opts.get and not opts.post:
            raise common.Fatal("--get or --post required")
        if opts.get and opts.post:
            raise common.Fatal("use --get or --post not both")
        for g in opts.get:
            if g.count("%s") != 1:
                raise common.Fatal("invalid GET address - must be a printf string")
        if opts.mode not in ("round-robin", "hostpool", "epsilon-greedy"):
            raise common.Fatal(f"invalid --mode {opts.mode!r} (round-robin, hostpool, "
                               "epsilon-greedy)")
        if not 0.0 <= opts.sample <= 1.0:
            raise common.Fatal("ERROR: --sample must be between 0.0 and 1.0")
        if opts.n < 1:
            raise common.Fatal("-n must be positive")
        if opts.http_client_connect_timeout <= 0 or opts.http_client_request_timeout <= 0:
            raise common.Fatal("--http-client-connect-timeout and "
                               "--http-client-request-timeout should be positive")

    def topics(self) -> list[str]:
        return [self.opts.topic]

    def progress(self) -> str:
        return f"{self.failures} failed requests"

    async def open(self) -> None:
        opts = self.opts
        self.is_post = bool(opts.post)
        self.dests = Destinations(opts.post if self.is_post else opts.get, opts.mode,
                                  opts.status_every)
        self.req_headers = {"User-Agent": f"nsq_to_http v{NSQ_VERSION}"}
        if self.is_post:
            self.req_headers["Content-Type"] = opts.content_type
        self.req_headers.update(self.headers)
        timeout = aiohttp.ClientTimeout(total=opts.http_client_request_timeout,
                                        connect=opts.http_client_connect_timeout)
        self.session = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=opts.n),
            auto_decompress=False)
        self.slots = asyncio.Semaphore(opts.n)
        self.failures = 0

    async def close(self) -> None:
        await self.session.close()

    async def request(self, addr: str, body: bytes) -> None:
        if self.is_post:
            resp_ctx = self.session.post(addr, data=body, headers=self.req_headers)
        else:
            resp_ctx = self.session.get(get_url(addr, body), headers=self.req_headers)
        async with resp_ctx as resp:
            await resp.read()
            if not 200 <= resp.status < 300:
                raise RuntimeError(f"got status code {resp.status}")

    async def handle(self, msg: Message) -> None:
        if self.opts.sample < 1.0 and random.random() > self.opts.sample:
            return
        async with self.slots:
            start = time.monotonic()
            addr = self.dests.pick()
            try:
                await self.request(addr, msg.body)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.failures += 1
                self.dests.failed(addr)
                raise RuntimeError(f"{addr}: {e}") from e
            self.dests.done(addr, start)
            self.dests.aggregate.status(start)
            self.reporter.add()

    def handler_for(self, topic: str) -> Callable[[Message], Awaitable[None]]:
        return self.handle


async def run(argv: Sequence[str] | None) -> int:
    return await run_consuming(ToHTTP, flags(), argv, __doc__ or "")


main = common.tool_main(PROG, run)


if __name__ == "__main__":
    main()
