"""``nsq_stat``: poll ``/stats`` of every nsqd that has a topic and print, every
``--interval``, the channel's depths and counters summed over those nodes (upstream
``apps/nsq_stat``).

The nodes are the ``--nsqd-http-address`` ones that have the topic, or the producers of the
topic according to ``--lookupd-http-address`` (``/lookup``). The first poll only takes a
baseline; each following one prints a row: ingress and egress rates (msgs/s over the last
interval), depth (total, in memory, on disk), in flight, deferred, requeued, timed out,
messages and clients. A header is printed every 25 rows. ``--count N`` stops after N rows.
SIGINT/SIGTERM/SIGHUP exit 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from nsqx.flags import Flag, FlagError, parse_go_int

from .common import Fatal, address_flags, http_client_flags, parse_flags

PROG = "nsq_stat"
ACCEPT = "application/vnd.nsq; version=1.0"


def _count(s: str) -> int:
    v = parse_go_int(s)
    if not -(2**31) <= v < 2**31:
        raise FlagError(f"value {s!r} out of range")
    return v


def flags() -> list[Flag]:
    return [
        Flag("version", "bool", False, "print version"),
        Flag("topic", "string", "", "NSQ topic"),
        Flag("channel", "string", "", "NSQ channel"),
        Flag("interval", "duration", 2.0, "duration of time between polling/printing output"),
        *http_client_flags(2.0, 5.0),
        Flag("count", "custom", None, "number of reports", parse=_count, default_text=""),
        *address_flags(nsqd="http"),
    ]


HEADER = ("{}+{}+{}\n".format("------rate------", "----------------depth----------------",
                              "--------------metadata---------------")
          + f"{'ingress':>7} {'egress':>7} | {'total':>7} {'mem':>7} {'disk':>7} {'inflt':>5} "
          f"{'def':>5} | {'req':>7} {'t-o':>7} {'msgs':>12} {'clients':>7}\n")


@dataclass
class ChannelStats:
    depth: int = 0
    memory_depth: int = 0
    backend_depth: int = 0
    in_flight_count: int = 0
    deferred_count: int = 0
    requeue_count: int = 0
    timeout_count: int = 0
    message_count: int = 0
    client_count: int = 0
    paused: bool = False

    def add(self, c: dict[str, Any]) -> None:
        depth = int(c.get("depth", 0))
        backend = int(c.get("backend_depth", 0))
        self.depth += depth
        self.backend_depth += backend
        self.memory_depth += depth - backend
        self.in_flight_count += int(c.get("in_flight_count", 0))
        self.deferred_count += int(c.get("deferred_count", 0))
        self.requeue_count += int(c.get("requeue_count", 0))
        self.timeout_count += int(c.get("timeout_count", 0))
        self.message_count += int(c.get("message_count", 0))
        self.client_count += int(c.get("client_count", 0))
        self.paused = self.paused or bool(c.get("paused"))


def row(cur: ChannelStats, old: ChannelStats, interval: float) -> str:
    ingress = int((cur.message_count - old.message_count) / interval)
    egress = int((cur.message_count - old.message_count - (cur.depth - old.depth)) / interval)
    return (f"{ingress:7d} {egress:7d} | {cur.depth:7d} {cur.memory_depth:7d} "
            f"{cur.backend_depth:7d} {cur.in_flight_count:5d} {cur.deferred_count:5d} | "
            f"{cur.requeue_count:7d} {cur.timeout_count:7d} {cur.message_count:12d} "
            f"{cur.client_count:7d}\n")


class Client:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def get_json(self, url: str) -> Any:
        req = urllib.request.Request(url, headers={"Accept": ACCEPT})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            data = json.loads(resp.read())
        # pre-1.0 envelope
        if isinstance(data, dict) and "status_code" in data and "data" in data:
            data = data["data"]
        return data


def _host(h: str) -> str:
    return f"[{h}]" if ":" in h and not h.startswith("[") else h


def topic_producers(client: Client, topic: str, nsqd: Sequence[str],
                    lookupd: Sequence[str]) -> list[str]:
    """HTTP addresses of the nsqd nodes that have ``topic``."""
    found: list[str] = []
    errors: list[str] = []
    if lookupd:
        for addr in lookupd:
            try:
                data = client.get_json(f"http://{addr}/lookup?topic={quote(topic)}")
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    continue
                errors.append(f"{addr}: {e}")
                continue
            except (OSError, ValueError) as e:
                errors.append(f"{addr}: {e}")
                continue
            for p in data.get("producers") or []:
                a = f"{_host(p.get('broadcast_address') or p.get('address'))}:{p['http_port']}"
                if a not in found:
                    found.append(a)
        if len(errors) == len(lookupd):
            raise Fatal("ERROR: failed to get topic producers - failed to query any "
                        "nsqlookupd: " + "; ".join(errors))
    else:
        for addr in nsqd:
            q = urlencode({"format": "json", "topic": topic, "include_clients": "false"})
            try:
                data = client.get_json(f"http://{addr}/stats?{q}")
            except (OSError, ValueError) as e:
                errors.append(f"{addr}: {e}")
                continue
            if any(t.get("topic_name") == topic for t in data.get("topics") or []):
                found.append(addr)
        if len(errors) == len(nsqd):
            raise Fatal("ERROR: failed to get topic producers - failed to query any nsqd: "
                        + "; ".join(errors))
    return found


def channel_stats(client: Client, producers: Sequence[str], topic: str,
                  channel: str) -> ChannelStats | None:
    total: ChannelStats | None = None
    errors = []
    q = urlencode({"format": "json", "topic": topic, "channel": channel,
                   "include_clients": "false"})
    for addr in producers:
        try:
            data = client.get_json(f"http://{addr}/stats?{q}")
        except (OSError, ValueError) as e:
            errors.append(f"{addr}: {e}")
            continue
        for t in data.get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            for c in t.get("channels") or []:
                if c.get("channel_name") == channel:
                    if total is None:
                        total = ChannelStats()
                    total.add(c)
    if producers and len(errors) == len(producers):
        raise Fatal("ERROR: failed to get nsqd stats - failed to query any nsqd: "
                    + "; ".join(errors))
    return total


def check_addrs(addrs: Sequence[str]) -> str | None:
    for a in addrs:
        if a.startswith("http"):
            return "address should not contain scheme"
    return None


def stat_loop(opts: Any, out: Any = None) -> None:
    out = out or sys.stdout
    client = Client(opts.http_client_request_timeout)
    old: ChannelStats | None = None
    i = 0
    while opts.count is None or opts.count >= i:
        producers = topic_producers(client, opts.topic, opts.nsqd_http_address,
                                    opts.lookupd_http_address)
        cur = channel_stats(client, producers, opts.topic, opts.channel)
        if cur is None:
            raise Fatal(f"ERROR: failed to find channel({opts.channel}) in stats metadata for "
                        f"topic({opts.topic})")
        if i % 25 == 0:
            out.write(HEADER)
        if old is not None:
            out.write(row(cur, old, opts.interval))
        out.flush()
        old = cur
        i += 1
        if opts.count is not None and i > opts.count:
            break
        time.sleep(opts.interval)


class _Stop(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_flags(PROG, flags(), argv, __doc__ or "")
    try:
        if not opts.topic or not opts.channel:
            raise Fatal("--topic and --channel are required")
        if opts.interval <= 0:
            raise Fatal("--interval should be positive")
        if opts.http_client_connect_timeout <= 0:
            raise Fatal("--http-client-connect-timeout should be positive")
        if opts.http_client_request_timeout <= 0:
            raise Fatal("--http-client-request-timeout should be positive")
        if opts.count is not None and opts.count <= 0:
            raise Fatal("--count should be positive")
        if not opts.nsqd_http_address and not opts.lookupd_http_address:
            raise Fatal("--nsqd-http-address or --lookupd-http-address required")
        if opts.nsqd_http_address and opts.lookupd_http_address:
            raise Fatal("use --nsqd-http-address or --lookupd-http-address not both")
        err = check_addrs(opts.nsqd_http_address)
        if err:
            raise Fatal(f"--nsqd-http-address error - {err}")
        err = check_addrs(opts.lookupd_http_address)
        if err:
            raise Fatal(f"--lookupd-http-address error - {err}")

        def on_signal(signum: int, frame: Any) -> None:
            raise _Stop

        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        try:
            stat_loop(opts)
        except _Stop:
            pass
        except BrokenPipeError:  # `nsq_stat ... | head`
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except OSError:
                pass
            raise SystemExit(1) from None
    except Fatal as e:
        print(f"{PROG}: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    raise SystemExit(0)


if __name__ == "__main__":
    main()
