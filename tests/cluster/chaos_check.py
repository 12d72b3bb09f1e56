"""The total-queue checker of the chaos tests: stock pynsq clients as subprocesses.

A :class:`Load` runs ``pynsq_chaos.py`` as one producer (numbered messages, one JSON line per
acknowledged publish) and one consumer (one line per delivery); :meth:`Load.finish` waits for
the producer, gives the consumer time to catch up and returns the tally: every acknowledged
message must have been consumed at least once (``lost`` empty), duplicates are counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.cluster import wait_until

SCRIPT = Path(__file__).with_name("pynsq_chaos.py")


def start_script(*args: str, out: Path, prefix: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``prefix``: e.g. ``ip netns exec NS`` (the fault suite's client host)."""
    return subprocess.Popen([*prefix, sys.executable, str(SCRIPT), *args], stdout=out.open("wb"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, **env) if env else None)


def read_events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


@dataclass
class Tally:
    acked: set[int]
    seen: Counter[int]
    failed: int

    @property
    def lost(self) -> set[int]:
        return self.acked - set(self.seen)

    @property
    def duplicates(self) -> int:
        return sum(c - 1 for c in self.seen.values() if c > 1)

    def __str__(self) -> str:
        return (f"acked {len(self.acked)}, failed {self.failed}, consumed {len(self.seen)} "
                f"distinct, lost {len(self.lost)}, duplicates {self.duplicates}")


class Load:
    """A pynsq producer and consumer on ``topic`` through nsqlookupd for ``seconds``."""

    def __init__(self, lookupd_http: str, topic: str, seconds: float, tmp: Path, *,
                 mode: str = "produce", channel: str = "c", prefix: Sequence[str] = (),
                 stop_file: Path | None = None) -> None:
        """``stop_file``: the producer ends early once it exists (see :meth:`end`)."""
        self.seconds = seconds
        self.stop_file = stop_file
        env = {"NSQX_CHAOS_STOP_FILE": str(stop_file)} if stop_file else None
        self.prod_out, self.cons_out = tmp / f"{topic}-producer.jsonl", tmp / f"{topic}-consumer.jsonl"
        self.consumer = start_script("consume", lookupd_http, topic, channel, str(seconds + 40),
                                     out=self.cons_out, prefix=prefix)
        self.producer = start_script(mode, lookupd_http, topic, str(seconds), out=self.prod_out,
                                     prefix=prefix, env=env)

    def end(self) -> None:
        """Tell the producer to stop publishing now (it needs a ``stop_file``)."""
        assert self.stop_file is not None
        self.stop_file.touch()

    def ack_times(self) -> dict[int, float]:
        """Message number -> when its publish was acknowledged (wall clock)."""
        return {e["ack"]: e["t"] for e in read_events(self.prod_out) if "ack" in e and "t" in e}

    def acked(self) -> int:
        return sum(1 for e in read_events(self.prod_out) if "ack" in e)

    def finish(self) -> Tally:
        try:
            assert self.producer.wait(self.seconds + 60) == 0, \
                self.prod_out.read_text()[-2000:]
            produced = read_events(self.prod_out)
            acked = {e["ack"] for e in produced if "ack" in e}

            def all_seen() -> bool:
                return acked <= {e["got"] for e in read_events(self.cons_out) if "got" in e}

            try:
                wait_until(all_seen, timeout=60, step=0.5, what="every acknowledged message "
                           "consumed")
            except AssertionError:
                pass  # the caller reports the numbers
        finally:
            self.stop()
        seen = Counter(e["got"] for e in read_events(self.cons_out) if "got" in e)
        return Tally(acked, seen, sum(1 for e in produced if "fail" in e))

    def stop(self) -> None:
        for p in (self.producer, self.consumer):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
