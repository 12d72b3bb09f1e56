"""pynsq producer or consumer for the cluster chaos test (run as a subprocess).

    python pynsq_chaos.py produce|produce-any LOOKUPD_HTTP TOPIC SECONDS
    python pynsq_chaos.py consume LOOKUPD_HTTP TOPIC CHANNEL SECONDS

The producer finds the topic's leader through nsqlookupd's /lookup (as a stock producer
configured from lookupd would), publishes numbered messages with pynsq's Writer, and on an
error looks the leader up again (produce-any: picks any node from /nodes, which forwards
to the leader). It prints one JSON line per acknowledged message
({"ack": n}); a publish whose callback never comes or reports an error is not acknowledged.
The consumer is pynsq's Reader on lookupd and prints {"got": n} per delivery (FIN after).
Acks carry the wall-clock time ({"ack": n, "t": ...}: the fault suite measures unavailability
from them); the producer also ends early once the file named by NSQX_CHAOS_STOP_FILE exists.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import urllib.request
import warnings

warnings.simplefilter("ignore")

import nsq  # noqa: E402
from tornado.ioloop import IOLoop  # noqa: E402

logging.basicConfig(level=logging.ERROR, stream=sys.stderr)


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def leader(lookupd: str, topic: str, any_node: bool = False) -> str | None:
    """The leader from /lookup, or (any_node) a random node from /nodes: it forwards."""
    path = "/nodes" if any_node else f"/lookup?topic={topic}"
    try:
        with urllib.request.urlopen(f"http://{lookupd}{path}", timeout=2) as r:
            body = json.loads(r.read())
    except (OSError, ValueError):
        return None
    producers = body.get("producers") or []
    if any_node:
        import random

        random.shuffle(producers)
    if not producers:
        return None
    p = producers[0]
    return f"{p['broadcast_address']}:{p['tcp_port']}"


def produce(lookupd: str, topic: str, seconds: float, any_node: bool = False) -> None:
    loop = IOLoop.current()
    state = {"n": 0, "writer": None, "addr": None, "inflight": 0, "writers": [],
             "last_answer": time.monotonic()}
    deadline = time.monotonic() + seconds
    stop_file = os.environ.get("NSQX_CHAOS_STOP_FILE")

    def done(n: int):
        def cb(conn, data):
            state["inflight"] = max(0, state["inflight"] - 1)
            state["last_answer"] = time.monotonic()
            if isinstance(data, nsq.Error) or data != b"OK":
                emit({"fail": n, "why": str(data)[:100]})
                state["addr"] = None  # look the leader up again
            else:
                emit({"ack": n, "t": time.time()})
        return cb

    def tick() -> None:
        if time.monotonic() > deadline or (stop_file and os.path.exists(stop_file)):
            emit({"end": state["n"]})
            loop.call_later(8, loop.stop)  # let late callbacks arrive
            return
        if state["addr"] is None or state["writer"] is None:
            addr = leader(lookupd, topic, any_node)
            if addr is not None:
                state["addr"] = addr
                w = nsq.Writer([addr], reconnect_interval=0.5)
                state["writers"].append(w)  # old writers stay: a late answer still counts
                state["writer"] = w
                state["since"] = time.monotonic()
            elif addr is None:
                loop.call_later(0.2, tick)
                return
        w = state["writer"]
        if state["inflight"] and time.monotonic() - state["last_answer"] > 3:
            # the node stopped answering (SIGSTOP, cut off): these publishes stay unacked
            # unless their answer still comes; go to whoever leads now
            emit({"stalled": state["inflight"]})
            state.update(addr=None, writer=None, inflight=0, last_answer=time.monotonic())
            loop.call_later(0.2, tick)
            return
        if state["inflight"] < 20 and w.conns:
            n = state["n"]
            state["n"] += 1
            state["inflight"] += 1
            try:
                w.pub(topic, b"%08d" % n, callback=done(n))
            except Exception as e:  # no connection: try the lookup again
                state["inflight"] -= 1
                emit({"fail": n, "why": repr(e)[:100]})
                state["addr"] = None
        elif not w.conns and time.monotonic() - state["since"] > 2:
            state["addr"] = None  # never connected: the leader moved or died
        loop.call_later(0.005, tick)

    loop.add_callback(tick)
    loop.start()


def consume(lookupd: str, topic: str, channel: str, seconds: float) -> None:
    def handler(msg: nsq.Message) -> bool:
        emit({"got": int(msg.body), "attempts": msg.attempts})
        return True

    nsq.Reader(message_handler=handler, lookupd_http_addresses=[f"http://{lookupd}"],
               topic=topic, channel=channel, lookupd_poll_interval=1, max_in_flight=50,
               lookupd_poll_jitter=0.0)
    loop = IOLoop.current()
    loop.call_later(seconds, loop.stop)
    loop.start()


if __name__ == "__main__":
    if sys.argv[1] in ("produce", "produce-any"):
        produce(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[1] == "produce-any")
    else:
        consume(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
