"""gnsq (gevent) scenarios for tests/compat/test_gnsq.py; contract in tests/support/clients.py.

Run: python client.py SCENARIO < params.json. Prints one JSON line. gevent monkeypatches this process
only, never pytest's. Uses gnsq's public API (Producer, Consumer, NsqdTCPClient, NsqdHTTPClient,
Message); the hooks only *record* the IDENTIFY/AUTH responses and error frames gnsq parsed.

Extra publish ops (gnsq's HTTP client, needs param ``nsqd_http``): ``http_pub`` (optional
``delay_ms``) and ``http_mpub`` (optional ``binary``).

gnsq cannot send IDENTIFY ``msg_timeout``: tests start nsqd with ``--msg-timeout`` instead.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import ssl  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402

warnings.simplefilter("ignore")

import gevent  # noqa: E402
import gnsq  # noqa: E402
from gnsq import errors as gnsq_errors  # noqa: E402

logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                    format="%(asctime)s gnsq %(levelname)s %(name)s: %(message)s")

CLOSING = [False]  # errors raised by our own close at the end are not the server's
OUT = {"timed_out": False, "results": [], "deliveries": [], "errors": [], "identify": [],
       "auth": [], "heartbeats": 0}

_orig_make_error = gnsq_errors.make_error


def _recording_make_error(data):
    if not CLOSING[0]:
        OUT["errors"].append(data.decode("utf-8", "replace"))
    return _orig_make_error(data)


gnsq_errors.make_error = _recording_make_error

_orig_identify = gnsq.NsqdTCPClient.identify
_orig_auth = gnsq.NsqdTCPClient.auth


def _recording_identify(self):
    data = _orig_identify(self)
    OUT["identify"].append(data if data is not None else "OK")
    return data


def _recording_auth(self):
    data = _orig_auth(self)
    OUT["auth"].append(data)
    return data


_orig_handle_response = gnsq.NsqdTCPClient.handle_response


def _recording_handle_response(self, data):
    if data == gnsq.protocol.HEARTBEAT:
        OUT["heartbeats"] += 1
    return _orig_handle_response(self, data)


gnsq.NsqdTCPClient.handle_response = _recording_handle_response
gnsq.NsqdTCPClient.identify = _recording_identify
gnsq.NsqdTCPClient.auth = _recording_auth


def err_text(err):
    if isinstance(err, gnsq_errors.NSQErrorCode) and OUT["errors"]:
        return OUT["errors"][-1]  # the raw frame text ("E_CODE description")
    return f"{type(err).__name__}: {err}"


def conn_kwargs(p):
    c = p.get("conn") or {}
    kw = {}
    if c.get("tls"):
        kw["tls_v1"] = True
        opts = {"cert_reqs": ssl.CERT_REQUIRED if c.get("ca") else ssl.CERT_NONE}
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
        kw["auth_secret"] = c["auth_secret"].encode()
    if c.get("heartbeat_s"):
        kw["heartbeat_interval"] = int(c["heartbeat_s"])
    if c.get("msg_timeout_ms"):
        raise SystemExit("gnsq cannot negotiate msg_timeout; use nsqd --msg-timeout")
    return kw


def record(reader, msg, action):
    OUT["deliveries"].append({
        "reader": reader, "id": msg.id.decode(), "body": msg.body.hex(),
        "attempts": msg.attempts, "timestamp_ns": msg.timestamp, "recv_ns": time.time_ns(),
        "action": action})


def deadline_of(p):
    return time.monotonic() + float(p.get("deadline_s", 20))


def wait_until(cond, deadline):
    while not cond():
        if time.monotonic() > deadline:
            OUT["timed_out"] = True
            return False
        gevent.sleep(0.02)
    return True


# -- publish ------------------------------------------------------------------------------------
class RawPublisher:
    """gnsq's low-level NsqdTCPClient, one command then its answer.

    Used when TLS/snappy/deflate is negotiated: gnsq 1.0.2's Producer crashes on the "OK" frame
    that follows each upgrade (Producer.handle_response pops a response queue that only exists
    after the connection is set up: KeyError), against any nsqd.
    """

    def __init__(self, p):
        host, port = p["nsqd"].rsplit(":", 1)
        self.conn = gnsq.NsqdTCPClient(host, int(port), **conn_kwargs(p))
        self.conn.connect()
        self.conn.identify()

    def call(self, send):
        send()
        while True:
            frame, data = self.conn.read_response()
            if frame == gnsq.protocol.FRAME_TYPE_ERROR:
                raise data
            if frame == gnsq.protocol.FRAME_TYPE_RESPONSE and data == gnsq.protocol.HEARTBEAT:
                continue
            return data

    def publish(self, topic, body, defer=None):
        return self.call(lambda: self.conn.publish(topic, body, defer=defer))

    def multipublish(self, topic, bodies):
        return self.call(lambda: self.conn.multipublish(topic, bodies))

    def close(self):
        self.conn.close_stream()


class ProducerPublisher:
    """gnsq.Producer, the API gnsq users publish with."""

    def __init__(self, p, deadline):
        self.deadline = deadline
        self.producer = gnsq.Producer([p["nsqd"]], **conn_kwargs(p))
        self.producer.start()

    def _wait(self, pending):
        return pending.get(timeout=max(0.1, self.deadline - time.monotonic()))

    def publish(self, topic, body, defer=None):
        return self._wait(self.producer.publish(topic, body, defer=defer, block=False,
                                                raise_error=False))

    def multipublish(self, topic, bodies):
        return self._wait(self.producer.multipublish(topic, bodies, block=False,
                                                     raise_error=False))

    def close(self):
        self.producer.close()


def scenario_publish(p):
    deadline = deadline_of(p)
    c = p.get("conn") or {}
    publisher = None
    http = None
    timer = gevent.Timeout(max(0.1, deadline - time.monotonic()))
    timer.start()
    try:
        for op in p["ops"]:
            kind = op["op"]
            try:
                if kind.startswith("http_"):
                    if http is None:
                        host, port = p["nsqd_http"].rsplit(":", 1)
                        http = gnsq.NsqdHTTPClient(host, int(port))
                    if kind == "http_pub":
                        res = http.publish(op["topic"], bytes.fromhex(op["body"]),
                                           defer=op.get("delay_ms"))
                    elif kind == "http_mpub":
                        res = http.multipublish(op["topic"],
                                                [bytes.fromhex(b) for b in op["bodies"]],
                                                binary=bool(op.get("binary")))
                    else:
                        raise ValueError(op)
                else:
                    if publisher is None:
                        if c.get("tls") or c.get("snappy") or c.get("deflate"):
                            publisher = RawPublisher(p)
                        else:
                            publisher = ProducerPublisher(p, deadline)
                    if kind == "pub":
                        res = publisher.publish(op["topic"], bytes.fromhex(op["body"]))
                    elif kind == "mpub":
                        res = publisher.multipublish(op["topic"],
                                                     [bytes.fromhex(b) for b in op["bodies"]])
                    elif kind == "dpub":
                        res = publisher.publish(op["topic"], bytes.fromhex(op["body"]),
                                                defer=int(op["delay_ms"]))
                    else:
                        raise ValueError(op)
            except gnsq_errors.NSQNoConnections:
                detail = OUT["errors"][-1] if OUT["errors"] else "no connection"
                OUT["results"].append("ERR " + detail)
                break
            except gnsq_errors.NSQException as e:
                OUT["results"].append("ERR " + err_text(e))
                break
            OUT["results"].append(res.decode() if isinstance(res, bytes) else str(res))
    except gevent.Timeout:
        OUT["timed_out"] = True
    finally:
        timer.cancel()
        CLOSING[0] = True
        if publisher is not None:
            publisher.close()


# -- consume ------------------------------------------------------------------------------------
class Reader:
    def __init__(self, p, name, mode, max_in_flight):
        self.p, self.name, self.mode = p, name, mode
        self.fins = 0
        self.held = 0
        self.consumer = gnsq.Consumer(
            p["topic"], p["channel"], [p["nsqd"]], max_in_flight=max_in_flight, max_tries=0,
            message_handler=self.handle, **conn_kwargs(p))

    def fin(self, msg, action="fin"):
        record(self.name, msg, action)
        msg.finish()
        self.fins += 1

    def handle(self, consumer, message):
        message.enable_async()
        first = message.attempts == 1
        p = self.p
        limit = int(p.get("fin_limit") or 0)
        if (self.mode == "hold_first" and first) or (limit and self.fins >= limit):
            record(self.name, message, "hold")
            self.held += 1
        elif first and message.body.hex() in (p.get("late_fin_bodies") or []):
            record(self.name, message, "hold")

            def late_fin():
                record(self.name, message, "late-fin")
                message.finish()

            gevent.spawn_later(int(p.get("late_fin_ms", 2500)) / 1000.0, late_fin)
        elif self.mode == "req" and first:
            record(self.name, message, "req")
            message.requeue(time_ms=int(p.get("req_delay_ms", 0)), backoff=False)
        elif self.mode == "touch" and first:
            def toucher():
                for _ in range(int(p.get("touches", 3))):
                    gevent.sleep(int(p.get("touch_interval_ms", 500)) / 1000.0)
                    message.touch()
                gevent.sleep(int(p.get("touch_interval_ms", 500)) / 1000.0)
                self.fin(message, "touch+fin")
            gevent.spawn(toucher)
        else:
            self.fin(message)


def run_until(p, done, deadline):
    stop_on_error = bool(p.get("stop_on_error"))
    ok = wait_until(lambda: done() or (stop_on_error and OUT["errors"]), deadline)
    if ok and not (stop_on_error and OUT["errors"] and not done()):
        gevent.sleep(float(p.get("idle_s", 0)))
    elif ok:
        gevent.sleep(0.3)


def scenario_consume(p):
    deadline = deadline_of(p)
    expect = int(p.get("expect", 0))
    want = set(p.get("expect_bodies") or [])
    r = Reader(p, "A", p.get("mode", "fin"), int(p.get("max_in_flight", 10)))

    def done():
        if want:
            return want <= {d["body"] for d in OUT["deliveries"] if d["action"] != "hold"}
        return expect > 0 and r.fins >= expect

    r.consumer.start(block=False)
    try:
        run_until(p, done, deadline)
    finally:
        CLOSING[0] = True
        r.consumer.close()


def scenario_handoff(p):
    """A is gnsq's low-level NsqdTCPClient (so no RDY redistribution can undo its RDY 0)."""
    deadline = deadline_of(p)
    expect = int(p.get("expect", 1))
    host, port = p["nsqd"].rsplit(":", 1)
    a = gnsq.NsqdTCPClient(host, int(port), **conn_kwargs(p))
    held = []

    def on_message(conn, message):
        record("A", message, "hold")
        held.append(message)
        if len(held) >= expect:
            conn.ready(0)

    a.on_message.connect(on_message)
    a.connect()
    a.identify()
    a.subscribe(p["topic"], p["channel"])
    a.ready(expect)
    listener = gevent.spawn(a.listen)
    b = None
    try:
        if not wait_until(lambda: len(held) >= expect, deadline):
            return
        b = Reader(p, "B", "fin", expect)
        b.consumer.start(block=False)
        run_until(p, lambda: b.fins >= expect, deadline)
    finally:
        CLOSING[0] = True
        if b is not None:
            b.consumer.close()
        a.close_stream()
        listener.kill(block=False)


SCENARIOS = {"publish": scenario_publish, "consume": scenario_consume,
             "handoff": scenario_handoff}


def main():
    scenario, params = sys.argv[1], json.loads(sys.stdin.read())
    try:
        SCENARIOS[scenario](params)
    except Exception:
        OUT["crash"] = traceback.format_exc()
    print(json.dumps(OUT, default=str), flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # lingering greenlets (reconnect timers) must not keep the process alive


if __name__ == "__main__":
    main()
