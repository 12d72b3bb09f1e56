"""A gnsq 1.0.2 Consumer that finds its nsqds only through nsqlookupd (run in a subprocess).

Usage: python gnsq_lookup_reader.py '{"lookupd": "127.0.0.1:P", "topic": "t",
        "channel": "c", "expect": N, "deadline_s": 30}'
Prints one JSON line: {"bodies": [...], "timed_out": bool, "connections": [host:port, ...]}.
"""

from __future__ import annotations

import gevent.monkey

gevent.monkey.patch_all()

import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
import gnsq  # noqa: E402

logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s gnsq %(levelname)s %(name)s: %(message)s")


def main() -> None:
    p = json.loads(sys.argv[1])
    out: dict = {"bodies": [], "timed_out": False, "connections": []}
    consumer = gnsq.Consumer(p["topic"], p["channel"], lookupd_http_addresses=[p["lookupd"]],
                             lookupd_poll_interval=1, max_in_flight=20)
    done = gevent.event.Event()

    @consumer.on_message.connect
    def handler(_consumer, message) -> None:  # type: ignore[no-untyped-def]
        out["bodies"].append(message.body.decode())
        if len(out["bodies"]) >= p["expect"]:
            done.set()

    consumer.start(block=False)
    if not done.wait(float(p.get("deadline_s", 30))):
        out["timed_out"] = True
    gevent.sleep(0.3)  # let the FINs go out
    out["connections"] = sorted(f"{c.address}:{c.port}" for c in consumer._connections)  # no public accessor in gnsq 1.0.2
    consumer.close()
    consumer.join(5)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
