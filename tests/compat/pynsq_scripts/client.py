"""pynsq (tornado) scenarios for tests/compat/test_pynsq.py; contract in tests/support/clients.py.

Run: python client.py SCENARIO < params.json. Prints one JSON line. Uses only pynsq's public API
(Writer, Reader, Message); the one hook is a wrapper around AsyncConn.trigger to *record* the
IDENTIFY/AUTH responses and error frames the client saw.
"""

from __future__ import annotations

import json
import logging
import ssl
import sys
import time
import traceback
import warnings

warnings.simplefilter("ignore")

import nsq  # noqa: E402
from nsq import event, protocol  # noqa: E402
from nsq.conn import AsyncConn  # noqa: E402
from tornado.ioloop import IOLoop  # noqa: E402

logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                    format="%(asctime)s pynsq %(levelname)s %(name)s: %(message)s")

CLOSING = [False]  # errors raised by our own close() at the end are not the server's
OUT: dict = {"timed_out": False, "results": [], "deliveries": [], "errors": [], "identify": [],
             "auth": [], "heartbeats": 0}


def err_text(err) -> str:
    if isinstance(err, protocol.Error) and err.args and isinstance(err.args[0], bytes):
        return err.args[0].decode("utf-8", "replace")
    return f"{type(err).__name__}: {err}"


_orig_trigger = AsyncConn.trigger


def _recording_trigger(self, name, *args, **kwargs):
    if name == event.IDENTIFY_RESPONSE:
        OUT["identify"].append(kwargs.get("data"))
    elif name == event.AUTH_RESPONSE:
        OUT["auth"].append(kwargs.get("data"))
    elif name == event.HEARTBEAT:
        OUT["heartbeats"] += 1
    elif name == event.ERROR and not CLOSING[0]:
        OUT["errors"].append(err_text(kwargs.get("error")))
    return _orig_trigger(self, name, *args, **kwargs)


AsyncConn.trigger = _recording_trigger


def conn_kwargs(p: dict) -> dict:
    c = p.get("conn") or {}
    kw: dict = {}
    if c.get("tls"):
        kw["tls_v1"] = True
        opts: dict = {"cert_reqs": ssl.CERT_REQUIRED if c.get("ca") else ssl.CERT_NONE}
        if c.get("ca"):
            opts["ca_certs"] = c["ca"]
        if c.get("cert"):
            opts["certfile"] = c["cert"]
            opts["keyfile"] = c["key"]
        kw["tls_options"] = opts
    if c.get("snappy"):
        kw["snappy"] = True
    if c.get("deflate"):
        kw["deflate"] = True
        if c.get("deflate_level"):
            kw["deflate_level"] = int(c["deflate_level"])
    if c.get("auth_secret"):
        kw["auth_secret"] = c["auth_secret"]
    if c.get("msg_timeout_ms"):
        kw["msg_timeout"] = c["msg_timeout_ms"] / 1000.0
    if c.get("heartbeat_s"):
        kw["heartbeat_interval"] = int(c["heartbeat_s"])
    return kw


class Run:
    def __init__(self, params: dict) -> None:
        self.p = params
        self.loop = IOLoop.current()
        self.closers: list = []
        self.finished = False
        self.loop.call_later(float(params.get("deadline_s", 20)), self.on_deadline)

    def on_deadline(self) -> None:
        if not self.finished:
            OUT["timed_out"] = True
            self.finish()

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        CLOSING[0] = True
        for close in self.closers:
            try:
                close()
            except Exception:
                traceback.print_exc()
        self.loop.call_later(0.2, self.loop.stop)

    def poll(self, cond, then, interval: float = 0.02) -> None:
        """Call ``then`` once ``cond()`` holds (unless the run ended)."""
        if self.finished:
            return
        if cond():
            then()
        else:
            self.loop.call_later(interval, self.poll, cond, then, interval)


# -- publish ------------------------------------------------------------------------------------
def scenario_publish(run: Run) -> None:
    p = run.p
    writer = nsq.Writer([p["nsqd"]], **conn_kwargs(p))
    run.closers.append(lambda: [c.close() for c in list(writer.conns.values())])
    ops = list(p["ops"])

    def next_op() -> None:
        if not ops:
            return run.finish()
        op = ops.pop(0)

        def done(conn, data) -> None:
            if isinstance(data, Exception):
                OUT["results"].append("ERR " + err_text(data))
                return run.finish()
            OUT["results"].append(data.decode() if isinstance(data, bytes) else str(data))
            next_op()

        if op["op"] == "pub":
            writer.pub(op["topic"], bytes.fromhex(op["body"]), callback=done)
        elif op["op"] == "mpub":
            writer.mpub(op["topic"], [bytes.fromhex(b) for b in op["bodies"]], callback=done)
        elif op["op"] == "dpub":
            writer.dpub(op["topic"], int(op["delay_ms"]), bytes.fromhex(op["body"]),
                        callback=done)
        else:
            raise ValueError(op)

    def ready_or_failed() -> bool:
        return bool(writer.conns) or bool(OUT["errors"])

    def start() -> None:
        if not writer.conns:  # the connection failed (e.g. AUTH refused): report as the op result
            OUT["results"].append("ERR " + OUT["errors"][-1])
            return run.finish()
        next_op()

    run.poll(ready_or_failed, start)


# -- consume ------------------------------------------------------------------------------------
class Consumer:
    """One pynsq Reader recording deliveries and answering them as the scenario asks."""

    def __init__(self, run: Run, name: str, mode: str, on_change, max_in_flight: int) -> None:
        self.run, self.name, self.mode, self.on_change = run, name, mode, on_change
        p = run.p
        self.fins = 0
        self.held = 0
        self.reader = nsq.Reader(
            topic=p["topic"], channel=p["channel"], message_handler=self.handle,
            nsqd_tcp_addresses=[p["nsqd"]], max_in_flight=max_in_flight, max_tries=0,
            lookupd_poll_interval=60, **conn_kwargs(p))
        run.closers.append(self.reader.close)

    def record(self, msg, action: str) -> None:
        OUT["deliveries"].append({
            "reader": self.name, "id": msg.id.decode() if isinstance(msg.id, bytes) else msg.id,
            "body": msg.body.hex(), "attempts": msg.attempts, "timestamp_ns": msg.timestamp,
            "recv_ns": time.time_ns(), "action": action})

    def fin(self, msg, action: str = "fin") -> None:
        self.record(msg, action)
        msg.finish()
        self.fins += 1
        self.on_change()

    def handle(self, msg):
        msg.enable_async()
        p = self.run.p
        first = msg.attempts == 1
        limit = int(p.get("fin_limit") or 0)
        if (self.mode == "hold" or (self.mode == "hold_first" and first)
                or (limit and self.fins >= limit)):
            self.record(msg, "hold")
            self.held += 1
            self.on_change()
        elif first and msg.body.hex() in (p.get("late_fin_bodies") or []):
            self.record(msg, "hold")

            def late_fin() -> None:
                self.record(msg, "late-fin")
                msg.finish()

            self.run.loop.call_later(int(p.get("late_fin_ms", 2500)) / 1000.0, late_fin)
        elif self.mode == "req" and first:
            self.record(msg, "req")
            msg.requeue(backoff=False, time_ms=int(p.get("req_delay_ms", 0)))
        elif self.mode == "touch" and first:
            left = [int(p.get("touches", 3))]
            interval = int(p.get("touch_interval_ms", 500)) / 1000.0

            def tick() -> None:
                if left[0] > 0:
                    left[0] -= 1
                    msg.touch()
                    self.run.loop.call_later(interval, tick)
                else:
                    self.fin(msg, "touch+fin")

            self.run.loop.call_later(interval, tick)
        else:
            self.fin(msg)
        return None


def _finish_after_idle(run: Run, done):
    """A callback that, once ``done()`` holds, ends the run after ``idle_s`` more seconds."""
    idle = float(run.p.get("idle_s", 0))
    fired = [False]

    def check() -> None:
        if not fired[0] and done():
            fired[0] = True
            run.loop.call_later(idle, run.finish)

    return check


def _stop_on_error(run: Run) -> None:
    if run.p.get("stop_on_error"):
        run.poll(lambda: bool(OUT["errors"]), lambda: run.loop.call_later(0.3, run.finish))


def scenario_consume(run: Run) -> None:
    p = run.p
    expect = int(p.get("expect", 0))
    holder: list[Consumer] = []
    want = set(p.get("expect_bodies") or [])

    def done() -> bool:
        if want:
            got = {d["body"] for d in OUT["deliveries"] if d["action"] != "hold"}
            return want <= got
        return bool(holder) and expect > 0 and holder[0].fins >= expect

    check = _finish_after_idle(run, done)
    holder.append(Consumer(run, "A", p.get("mode", "fin"), check,
                           int(p.get("max_in_flight", 10))))
    _stop_on_error(run)


def scenario_handoff(run: Run) -> None:
    p = run.p
    expect = int(p.get("expect", 1))
    readers: dict[str, Consumer] = {}

    def b_changed() -> None:
        check()

    check = _finish_after_idle(run, lambda: "B" in readers and readers["B"].fins >= expect)

    def a_changed() -> None:
        a = readers["A"]
        if a.held >= expect and "B" not in readers:
            a.reader.set_max_in_flight(0)  # RDY 0: only B may get the timed-out messages
            readers["B"] = Consumer(run, "B", "fin", b_changed, expect)

    readers["A"] = Consumer(run, "A", "hold", a_changed, expect)
    _stop_on_error(run)


SCENARIOS = {"publish": scenario_publish, "consume": scenario_consume,
             "handoff": scenario_handoff}


def main() -> None:
    scenario, params = sys.argv[1], json.loads(sys.stdin.read())
    loop = IOLoop.current()
    run_holder: list[Run] = []

    def begin() -> None:
        try:
            run = Run(params)
            run_holder.append(run)
            SCENARIOS[scenario](run)
        except Exception:
            OUT["crash"] = traceback.format_exc()
            loop.stop()

    loop.add_callback(begin)
    loop.start()
    print(json.dumps(OUT, default=str), flush=True)


if __name__ == "__main__":
    main()
