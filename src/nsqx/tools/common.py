"""What the utilities share: flags, ``--consumer-opt``/``--producer-opt``, progress on stderr,
signal handling and the way a tool starts and exits.

Every tool keeps upstream's flag names and defaults (``apps/*`` in nsqio/nsq), in Go's and GNU's
syntaxes (:mod:`nsqx.flags`). Tools only use public APIs: :mod:`nsqx.client` and the HTTP
APIs of nsqd and nsqlookupd.

Exit codes: 0 after a clean stop (end of input, ``-n`` reached, SIGINT/SIGTERM), 1 on a fatal
error (upstream's ``log.Fatal``), 2 on a bad flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from nsqx import NSQ_VERSION, __version__
from nsqx.client import Consumer
from nsqx.flags import (
    Flag,
    FlagError,
    FlagSet,
    http_client_flags,
    parse_float,
    parse_go_bool,
    parse_go_duration,
    parse_go_int,
    peer_flag,
)

__all__ = [
    "ConnOptions",
    "Fatal",
    "RateReporter",
    "StopSignal",
    "TimerMetrics",
    "address_flags",
    "conn_options",
    "consume_until_stopped",
    "consumer_flags",
    "destination_flag",
    "http_client_flags",
    "fatal",
    "parse_flags",
    "run_tool",
    "setup_logging",
    "tool_main",
    "user_agent",
    "version_string",
]

log = logging.getLogger("nsqx.tools")


class Fatal(Exception):
    """A fatal error: printed as ``prog: message`` and exit status 1 (upstream's log.Fatal)."""


def fatal(msg: str) -> Fatal:
    return Fatal(msg)


def version_string(prog: str) -> str:
    return f"{prog} v{NSQ_VERSION} (nsqx/{__version__})"


def user_agent(prog: str) -> str:
    return f"{prog}/{NSQ_VERSION} nsqx/{__version__}"


# ---------------------------------------------------------------- flags


def version_flag() -> Flag:
    return Flag("version", "bool", False, "print version string")


def address_flags(*, nsqd: str = "tcp") -> list[Flag]:
    """--nsqd-<tcp|http>-address and --lookupd-http-address: checked when parsed (a bad
    port fails at start with Go's "invalid value ... for flag" message, exit 2)."""
    return [
        peer_flag(f"nsqd-{nsqd}-address", f"nsqd {nsqd.upper()} address (may be given multiple "
                  "times)"),
        peer_flag("lookupd-http-address", "lookupd HTTP address (may be given multiple times)"),
    ]


def destination_flag(name: str) -> Flag:
    """Where a producing tool publishes (to_nsq, nsq_to_nsq)."""
    return peer_flag(name, "destination nsqd TCP address (may be given multiple times)")


def consumer_opt_flag() -> Flag:
    return Flag("consumer-opt", "strings", [],
                "option to passthrough to the consumer, as 'key,value' (may be given multiple "
                "times; go-nsq's Config names: " + ", ".join(sorted(CONSUMER_KEYS | CONN_KEYS))
                + ")")


def producer_opt_flag() -> Flag:
    return Flag("producer-opt", "strings", [],
                "option to passthrough to the producer, as 'key,value' (may be given multiple "
                "times; go-nsq's Config names: " + ", ".join(sorted(CONN_KEYS)) + ")")


def stats_interval_flag(default: float = 10.0) -> Flag:
    return Flag("stats-interval", "duration", default,
                "how often to print message totals and rate on stderr (0 disables; a TTY gets a "
                "progress line updated in place) [nsqx]")


def consumer_flags(channel_default: str, channel_help: str = "nsq channel") -> list[Flag]:
    """Flags every consuming tool has (besides --topic)."""
    return [
        Flag("channel", "string", channel_default, channel_help),
        Flag("max-in-flight", "int", 200, "max number of messages to allow in flight"),
        *address_flags(),
        consumer_opt_flag(),
    ]


class Options:
    """Parsed flags as attributes (``opts.max_in_flight``), defaults filled in; ``opts[dest]``
    works too."""

    def __getitem__(self, name: str) -> Any:
        return self.__dict__[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self.__dict__[name] = value

    def __repr__(self) -> str:
        return f"Options({self.__dict__!r})"


def parse_flags(prog: str, flags: Iterable[Flag], argv: Sequence[str] | None,
                description: str = "") -> Options:
    """argv -> Options with every flag's default filled in. ``--help`` prints every flag (with
    its default) and exits 0, ``--version`` prints the version and exits 0, a bad flag exits 2."""
    fs = FlagSet(prog, flags)
    if argv is None:
        argv = sys.argv[1:]
    try:
        given, positional = fs.parse(argv)
    except FlagError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        print(f"Run '{prog} --help' for the list of flags.", file=sys.stderr)
        raise SystemExit(2) from None
    if given.pop("help", False):
        if description:
            sys.stdout.write(description.rstrip() + "\n\n")
        sys.stdout.write(fs.usage())
        raise SystemExit(0)
    if given.get("version"):
        print(version_string(prog))
        raise SystemExit(0)
    if positional:
        print(f"{prog}: unknown arguments: {positional}", file=sys.stderr)
        raise SystemExit(2)
    opts = Options()
    for f in fs:
        d = f.default
        opts[f.dest] = list(d) if isinstance(d, list) else d
    for k, v in given.items():
        opts[k] = v
    return opts


def check_addresses(opts: Options, *, nsqd: str = "nsqd_tcp_address") -> None:
    """Exactly one of --nsqd-tcp-address / --lookupd-http-address, as upstream."""
    flag = "--" + nsqd.replace("_", "-")
    if not opts[nsqd] and not opts.lookupd_http_address:
        raise Fatal(f"{flag} or --lookupd-http-address required")
    if opts[nsqd] and opts.lookupd_http_address:
        raise Fatal(f"use {flag} or --lookupd-http-address not both")


# ---------------------------------------------------------------- --consumer-opt / --producer-opt

# go-nsq Config option -> (nsqx keyword, parser); ConnConfig keywords
CONN_KEYS = {
    "tls_v1", "tls_root_ca_file", "tls_insecure_skip_verify", "tls_cert", "tls_key",
    "tls_min_version", "snappy", "deflate", "deflate_level", "auth_secret",
    "heartbeat_interval", "msg_timeout", "sample_rate", "output_buffer_size",
    "output_buffer_timeout", "client_id", "hostname", "user_agent", "dial_timeout",
    "read_timeout",
}
# Consumer keywords
CONSUMER_KEYS = {
    "max_in_flight", "max_attempts", "default_requeue_delay", "max_requeue_delay",
    "backoff_multiplier", "max_backoff_duration", "lookupd_poll_interval",
    "lookupd_poll_jitter", "low_rdy_idle_timeout", "low_rdy_timeout",
    "rdy_redistribute_interval",
}
# go-nsq options with no nsqx equivalent: accepted with a warning
IGNORED_KEYS = {
    "write_timeout", "local_addr", "backoff_strategy", "topology_region", "topology_zone",
    "max_msg_size", "lookupd_poll_timeout", "skip_lookupd_authorization", "tls_config",
}

_RENAMES = {
    "dial_timeout": "connect_timeout",
    "default_requeue_delay": "requeue_delay",
}


def _duration(s: str) -> float:
    return parse_go_duration(s)


def _int(s: str) -> int:
    return parse_go_int(s)


def _bool(s: str) -> bool:
    return parse_go_bool(s)


_PARSERS: dict[str, Callable[[str], Any]] = {
    "tls_v1": _bool, "tls_insecure_skip_verify": _bool, "snappy": _bool, "deflate": _bool,
    "deflate_level": _int, "heartbeat_interval": _duration, "msg_timeout": _duration,
    "sample_rate": _int, "output_buffer_size": _int, "output_buffer_timeout": _duration,
    "dial_timeout": _duration, "read_timeout": _duration,
    "max_in_flight": _int, "max_attempts": _int, "default_requeue_delay": _duration,
    "max_requeue_delay": _duration, "backoff_multiplier": _duration,
    "max_backoff_duration": _duration, "lookupd_poll_interval": _duration,
    "lookupd_poll_jitter": parse_float, "low_rdy_idle_timeout": _duration,
    "low_rdy_timeout": _duration, "rdy_redistribute_interval": _duration,
}


@dataclass
class ConnOptions:
    """``--consumer-opt``/``--producer-opt`` turned into keyword arguments.

    ``conn``: :class:`~nsqx.client.ConnConfig` keywords; ``consumer``: Consumer keywords.
    ``kwargs()`` merges both for a Consumer (a Producer takes ``conn`` only).
    """

    conn: dict[str, Any] = field(default_factory=dict)
    consumer: dict[str, Any] = field(default_factory=dict)

    def consumer_kwargs(self) -> dict[str, Any]:
        return {**self.conn, **self.consumer}

    def producer_kwargs(self) -> dict[str, Any]:
        return dict(self.conn)


def conn_options(opts: Sequence[str], *, consumer: bool, flag: str,
                 user_agent: str | None = None) -> ConnOptions:
    """Parse go-nsq style ``key,value`` options (``key`` alone means true).

    Durations are Go durations (``30s``, ``250ms``). Raises Fatal on an unknown key or a bad
    value; keys of go-nsq that nsqx has no use for are accepted and ignored with a warning.
    """
    out = ConnOptions()
    tls: dict[str, Any] = {}
    allowed = CONN_KEYS | (CONSUMER_KEYS if consumer else set())
    for opt in opts:
        key, sep, value = opt.partition(",")
        key = key.strip()
        if not sep:
            value = "true"
        if key in IGNORED_KEYS:
            print(f"WARNING: --{flag} {key} has no effect in nsqx; ignored", file=sys.stderr)
            continue
        if key not in allowed:
            raise Fatal(f"--{flag}: unknown option {key!r}")
        parser = _PARSERS.get(key)
        try:
            v = parser(value) if parser else value
        except FlagError as e:
            raise Fatal(f"--{flag} {key}: {e}") from None
        if key.startswith("tls_") and key != "tls_v1":
            tls[key] = v
            continue
        if key == "tls_v1":
            tls["tls_v1"] = v
            continue
        name = _RENAMES.get(key, key)
        if key in CONSUMER_KEYS:
            out.consumer[name] = v
        else:
            out.conn[name] = v
    if tls.get("tls_v1"):  # as go-nsq: the other tls_* options only matter with tls_v1
        out.conn["tls"] = _ssl_context(tls)
    if user_agent and "user_agent" not in out.conn:
        out.conn["user_agent"] = user_agent
    return out


def _ssl_context(tls: dict[str, Any]) -> ssl.SSLContext | bool:
    if set(tls) == {"tls_v1"}:
        return True
    try:
        ctx = ssl.create_default_context(cafile=tls.get("tls_root_ca_file"))
        if tls.get("tls_insecure_skip_verify"):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if tls.get("tls_cert") or tls.get("tls_key"):
            ctx.load_cert_chain(tls.get("tls_cert") or tls.get("tls_key"), tls.get("tls_key"))
        mv = tls.get("tls_min_version")
        if mv:
            versions = {"tls1.0": ssl.TLSVersion.TLSv1, "tls1.1": ssl.TLSVersion.TLSv1_1,
                        "tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3}
            if mv not in versions:
                raise Fatal(f"{mv} is not a tls version")
            ctx.minimum_version = versions[mv]
    except (OSError, ssl.SSLError) as e:
        raise Fatal(f"TLS options: {e}") from None
    return ctx


# ---------------------------------------------------------------- logging


def setup_logging(level: str = "warn", prefix: str = "") -> None:
    levels = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
              "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}
    logging.basicConfig(level=levels.get(level.lower(), logging.WARNING),
                        format=f"{prefix}%(asctime)s %(levelname)s: %(message)s",
                        stream=sys.stderr)


# ---------------------------------------------------------------- progress on stderr


class RateReporter:
    """Counts messages and prints ``N msgs, X msgs/s`` lines on stderr every ``interval``.

    On a TTY the line is rewritten in place (``\\r``) and ended by :meth:`close`; otherwise a
    new line is printed each time. :meth:`close` prints the totals once more.
    """

    def __init__(self, prog: str, interval: float, *, what: str = "msgs",
                 stream: TextIO | None = None) -> None:
        self.prog = prog
        self.interval = interval
        self.what = what
        self.stream = stream or sys.stderr
        self.count = 0
        self.extra: Callable[[], str] | None = None  # more text for each line
        self._tty = _isatty(self.stream)
        self._started = time.monotonic()
        self._last_time = self._started
        self._last_count = 0
        self._task: asyncio.Task[None] | None = None
        self._dirty_line = False

    def add(self, n: int = 1) -> None:
        self.count += n

    def start(self) -> None:
        if self.interval > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.report()

    def line(self) -> str:
        now = time.monotonic()
        dt = max(now - self._last_time, 1e-9)
        rate = (self.count - self._last_count) / dt
        self._last_time = now
        self._last_count = self.count
        text = f"[{self.prog}] {self.count} {self.what}, {rate:.1f} {self.what}/s"
        if self.extra is not None:
            text += f", {self.extra()}"
        return text

    def report(self) -> None:
        text = self.line()
        try:
            if self._tty:
                self.stream.write("\r\x1b[2K" + text)
                self._dirty_line = True
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)  # its cancellation
            self._task = None
        if self.interval <= 0:
            return
        elapsed = max(time.monotonic() - self._started, 1e-9)
        text = (f"[{self.prog}] total {self.count} {self.what} in {elapsed:.1f}s "
                f"({self.count / elapsed:.1f} {self.what}/s)")
        try:
            if self._dirty_line:
                self.stream.write("\r\x1b[2K")
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class TimerMetrics:
    """bitly/timer_metrics: every ``status_every`` requests, print percentiles and mean."""

    def __init__(self, status_every: int, prefix: str) -> None:
        self.status_every = status_every
        self.prefix = prefix
        self._samples: list[float] = []

    def status(self, started: float) -> None:
        if self.status_every <= 0:
            return
        self._samples.append(time.monotonic() - started)
        if len(self._samples) >= self.status_every:
            s = sorted(self._samples)
            n = len(s)
            p99 = s[min(n - 1, int(n * 0.99))]
            p95 = s[min(n - 1, int(n * 0.95))]
            avg = sum(s) / n
            print(f"{self.prefix} finished {n} requests - 99th: {p99 * 1000:.2f}ms - "
                  f"95th: {p95 * 1000:.2f}ms - avg: {avg * 1000:.2f}ms", file=sys.stderr,
                  flush=True)
            self._samples.clear()


# ---------------------------------------------------------------- signals and running


class StopSignal:
    """SIGINT/SIGTERM set :attr:`event` (stop consuming, finish/requeue in-flight, exit 0).
    A second signal while stopping exits at once with status 1."""

    def __init__(self, prog: str, signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)
                 ) -> None:
        self.prog = prog
        self.event = asyncio.Event()
        self.signum: int | None = None
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: int) -> None:
        if self.event.is_set():
            print(f"{self.prog}: second signal, exiting without waiting", file=sys.stderr,
                  flush=True)
            os._exit(1)
        self.signum = sig
        self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()

    async def wait(self) -> None:
        await self.event.wait()


def run_tool(prog: str, coro_fn: Callable[[], Coroutine[Any, Any, int | None]]) -> None:
    """Run the tool's main coroutine (uvloop when available); exit with its status."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        rc = asyncio.run(coro_fn())
    except Fatal as e:
        print(f"{prog}: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        rc = 0
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    raise SystemExit(rc or 0)


def tool_main(prog: str, run: Callable[[Sequence[str] | None], Coroutine[Any, Any, int | None]]
              ) -> Callable[[Sequence[str] | None], None]:
    """The tool's ``main(argv=None)``: run ``run(argv)`` under :func:`run_tool`."""
    def main(argv: Sequence[str] | None = None) -> None:
        run_tool(prog, lambda: run(argv))

    return main


async def consume_until_stopped(opts: Options, topics: Iterable[str],
                                handler_for: Callable[[str], Callable[..., Any]],
                                stop: StopSignal, reporter: RateReporter,
                                consumer_kwargs: dict[str, Any], *,
                                max_in_flight: int | None = None,
                                announce: Callable[[str], None] | None = None) -> None:
    """The consuming tools' one set-up: a Consumer per topic on ``opts.channel`` (through
    ``--nsqd-tcp-address`` or ``--lookupd-http-address``) with ``handler_for(topic)``, all
    started, then the rate reporter; returns when ``stop`` is set, every consumer and the
    reporter closed. A bad consumer option is fatal (exit 1) with its message."""
    consumers: list[Consumer] = []
    try:
        for topic in topics:
            if announce is not None:
                announce(topic)
            c = Consumer(topic, opts.channel, handler_for(topic),
                         nsqd_tcp_addresses=opts.nsqd_tcp_address,
                         lookupd_http_addresses=opts.lookupd_http_address,
                         max_in_flight=max_in_flight or opts.max_in_flight, **consumer_kwargs)
            consumers.append(c)
            await c.start()
        reporter.start()
        await stop.wait()
    except (ValueError, TypeError) as e:
        raise Fatal(str(e)) from None
    finally:
        await asyncio.gather(*(c.close() for c in consumers), return_exceptions=True)
        await reporter.close()
