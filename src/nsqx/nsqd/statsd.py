"""Push node stats to statsd over UDP, with upstream's names (nsqd/statsd.go).

Every ``--statsd-interval`` the node's stats are sent as
``<prefix>topic.<t>.message_count:<delta>|c``, ``...depth:<n>|g`` and so on;
counters are the change since the previous push, gauges the current value.
Lines are packed into datagrams of at most ``--statsd-udp-packet-size`` bytes
and, like upstream, spread over the interval so a big node doesn't burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from nsqx.nsqd.metrics import memory_stats
from nsqx.protocol.names import is_ephemeral

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeAPI

__all__ = ["StatsdEmitter", "expand_prefix", "host_key", "pack_lines"]

log = logging.getLogger("nsqx.nsqd.statsd")



def host_key(hostport: str) -> str:
    """internal/statsd.HostKey: dots and colons become underscores."""
    return hostport.replace(".", "_").replace(":", "_")


def expand_prefix(prefix: str, broadcast_address: str, http_port: int) -> str:
    """``nsq.%s`` -> ``nsq.<broadcast host>_<port>.`` (a trailing dot is added if missing)."""
    if not prefix:
        return ""
    host = f"[{broadcast_address}]" if ":" in broadcast_address else broadcast_address
    out = prefix.replace("%s", host_key(f"{host}:{http_port}"))
    return out if out.endswith(".") else out + "."


def pack_lines(lines: list[bytes], size: int) -> list[bytes]:
    """Upstream's BoundaryBufferedWriter: never split a line; a line longer than
    ``size`` goes alone in its own datagram."""
    packets: list[bytes] = []
    buf: list[bytes] = []
    used = 0
    for line in lines:
        if used and used + len(line) > size:
            packets.append(b"".join(buf))
            buf, used = [], 0
        buf.append(line)
        used += len(line)
        if used >= size:
            packets.append(b"".join(buf))
            buf, used = [], 0
    if buf:
        packets.append(b"".join(buf))
    return packets


def _split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class StatsdEmitter:
    """Owns the statsd push task: ``start()`` in the node's loop, ``await close()``."""

    def __init__(self, nsqd: NodeAPI) -> None:
        self.nsqd = nsqd
        self._task: asyncio.Task[None] | None = None
        self._last: dict[str, tuple[int, int, dict[str, tuple[int, int, int]]]] = {}
        self._last_gc_runs = 0
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="statsd")

    async def close(self) -> None:
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        log.info("STATSD: closing")

    async def _run(self) -> None:
        interval = float(self.nsqd.opts.statsd_interval)
        next_at = time.monotonic() + interval
        while not self._closing:
            await asyncio.sleep(max(next_at - time.monotonic(), 0.0))
            next_at += interval
            if next_at < time.monotonic():  # fell behind (suspended process): don't burst
                next_at = time.monotonic() + interval
            try:
                await self.push_once(spread=max(interval - 1.0, 0.0))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("STATSD: push failed - %s", exc)

    # -- one push ----------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        o = self.nsqd.opts
        port = o.broadcast_http_port or self.nsqd.http_port
        return expand_prefix(o.statsd_prefix, o.broadcast_address, port)

    def collect(self) -> list[bytes]:
        """The lines of one push (and remember the counters for the next delta)."""
        o = self.nsqd.opts
        prefix = self.prefix
        exclude = o.statsd_exclude_ephemeral
        lines: list[bytes] = []

        def count(stat: str, delta: int) -> None:
            lines.append(f"{prefix}{stat}:{int(delta)}|c\n".encode())

        def gauge(stat: str, value: Any) -> None:
            lines.append(f"{prefix}{stat}:{int(value)}|g\n".encode())

        def delta(now: int, before: int) -> int:
            # a re-created topic/channel starts again from 0: count it from there
            return now - before if now >= before else now

        stats = self.nsqd.stats_dict(include_clients=False, include_mem=False)
        last = self._last
        current: dict[str, tuple[int, int, dict[str, tuple[int, int, int]]]] = {}
        for t in stats.get("topics") or []:
            tname = t["topic_name"]
            if exclude and is_ephemeral(tname):
                continue
            lt_count, lt_bytes, lt_chans = last.get(tname, (0, 0, {}))
            t_count, t_bytes = int(t.get("message_count", 0)), int(t.get("message_bytes", 0))
            count(f"topic.{tname}.message_count", delta(t_count, lt_count))
            count(f"topic.{tname}.message_bytes", delta(t_bytes, lt_bytes))
            gauge(f"topic.{tname}.depth", t.get("depth", 0))
            gauge(f"topic.{tname}.backend_depth", t.get("backend_depth", 0))
            for p in (t.get("e2e_processing_latency") or {}).get("percentiles") or []:
                gauge(f"topic.{tname}.e2e_processing_latency_{float(p['quantile']) * 100:.0f}",
                      p["value"])
            chans: dict[str, tuple[int, int, int]] = {}
            for c in t.get("channels") or []:
                cname = c["channel_name"]
                if exclude and is_ephemeral(cname):
                    continue
                base = f"topic.{tname}.channel.{cname}"
                lc = lt_chans.get(cname, (0, 0, 0))
                cur = (int(c.get("message_count", 0)), int(c.get("requeue_count", 0)),
                       int(c.get("timeout_count", 0)))
                chans[cname] = cur
                count(f"{base}.message_count", delta(cur[0], lc[0]))
                gauge(f"{base}.depth", c.get("depth", 0))
                gauge(f"{base}.backend_depth", c.get("backend_depth", 0))
                gauge(f"{base}.in_flight_count", c.get("in_flight_count", 0))
                gauge(f"{base}.deferred_count", c.get("deferred_count", 0))
                count(f"{base}.requeue_count", delta(cur[1], lc[1]))
                count(f"{base}.timeout_count", delta(cur[2], lc[2]))
                gauge(f"{base}.clients", c.get("client_count", 0))
                for p in (c.get("e2e_processing_latency") or {}).get("percentiles") or []:
                    gauge(f"{base}.e2e_processing_latency_{float(p['quantile']) * 100:.0f}",
                          p["value"])
            current[tname] = (t_count, t_bytes, chans)
        self._last = current

        if o.statsd_mem_stats:
            ms = memory_stats()
            for key in ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes",
                        "heap_released_bytes", "gc_pause_usec_100", "gc_pause_usec_99",
                        "gc_pause_usec_95", "next_gc_bytes"):
                gauge(f"mem.{key}", ms[key])
            count("mem.gc_runs", ms["gc_total_runs"] - self._last_gc_runs)
            self._last_gc_runs = ms["gc_total_runs"]
        return lines

    async def push_once(self, spread: float = 0.0) -> int:
        """Collect and send one round; returns the number of datagrams sent."""
        o = self.nsqd.opts
        lines = self.collect()
        packets = pack_lines(lines, max(int(o.statsd_udp_packet_size), 1))
        if not packets:
            return 0
        loop = asyncio.get_running_loop()
        try:
            host, port = _split_addr(o.statsd_address)
            transport, _ = await loop.create_datagram_endpoint(
                asyncio.DatagramProtocol, remote_addr=(host, port))
        except (OSError, ValueError) as exc:
            log.error("failed to create UDP socket to statsd(%s) - %s", o.statsd_address, exc)
            return 0
        log.info("STATSD: pushing stats to %s", o.statsd_address)
        try:
            pause = spread / len(packets) if spread > 0 else 0.0
            for i, packet in enumerate(packets):
                transport.sendto(packet)
                if pause and i < len(packets) - 1 and not self._closing:
                    await asyncio.sleep(pause)
        finally:
            transport.close()
        return len(packets)
