"""A pynsq 0.9.1 Reader that finds its nsqds only through nsqlookupd (run in a subprocess).

Usage: python pynsq_lookup_reader.py '{"lookupd": "http://127.0.0.1:P", "topic": "t",
        "channel": "c", "expect": N, "deadline_s": 30}'
Prints one JSON line: {"bodies": [...], "timed_out": bool, "connections": [host:port, ...]}.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

warnings.simplefilter("ignore")

import nsq  # noqa: E402
from tornado.ioloop import IOLoop  # noqa: E402

logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s pynsq %(levelname)s %(name)s: %(message)s")


def main() -> None:
    p = json.loads(sys.argv[1])
    out: dict = {"bodies": [], "timed_out": False, "connections": []}
    loop = IOLoop.current()
    reader: nsq.Reader | None = None

    def finish() -> None:
        if reader is not None:
            out["connections"] = sorted(reader.conns)
            reader.close()
        loop.call_later(0.2, loop.stop)

    def handler(message: nsq.Message) -> bool:
        out["bodies"].append(message.body.decode())
        if len(out["bodies"]) >= p["expect"]:
            loop.call_later(0.3, finish)  # let the FINs go out
        return True

    def deadline() -> None:
        out["timed_out"] = True
        finish()

    reader = nsq.Reader(topic=p["topic"], channel=p["channel"], message_handler=handler,
                        lookupd_http_addresses=[p["lookupd"]], lookupd_poll_interval=1,
                        max_in_flight=20)
    loop.call_later(float(p.get("deadline_s", 30)), deadline)
    loop.start()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
