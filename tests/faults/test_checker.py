"""The fault suite's own instruments: the checker and the power-loss journal must see what
they claim to (a checker that cannot fail proves nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.checker import Window, invented, judge, judge_ordered, split_brains
from tests.faults.power import build_shim, env, lose_unsynced


def test_judge_charges_each_ack_to_its_window() -> None:
    windows = [Window("a", 0.0, end=10.0), Window("b", 10.0, end=20.0)]
    acks = {1: 1.0, 2: 2.0, 3: 9.0, 4: 11.0, 5: 19.0}
    seen = Counter({1: 1, 2: 2, 3: 1, 5: 1})  # 4 never delivered, 2 twice
    a, b = judge(windows, acks, seen)
    assert (a.acked, a.lost, a.duplicates) == (3, [], 1)
    assert (b.acked, b.lost, b.duplicates) == (2, [4], 0)
    assert a.longest_gap == pytest.approx(7.0)  # 2.0 -> 9.0
    assert b.longest_gap == pytest.approx(8.0)  # 11.0 -> 19.0
    assert invented(Counter({0: 1, 7: 1, 12: 1}), published=10) == [12]


def test_split_brains_are_read_from_the_logs() -> None:
    line = "CLUSTER: TOPIC(t) PARTITION(0): leading at epoch {} ISR [...]\n"
    logs = {"n1": line.format(3) + line.format(5), "n2": line.format(4) + line.format(5),
            "n3": line.format(6)}
    assert split_brains(logs) == {("t", 0, 5): {"n1", "n2"}}


WRITER = """
import os, sys, time
path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"A" * 100)
os.fsync(fd)
os.write(fd, b"B" * 50)          # grows the file, never synced
os.pwrite(fd, b"C" * 10, 20)     # overwrites synced bytes, never synced
other = os.open(path + ".2", os.O_WRONLY | os.O_CREAT, 0o644)
os.write(other, b"D" * 30)
os.close(other)
import ctypes
ctypes.CDLL(None).syncfs(fd)      # makes both files durable so far
os.write(fd, b"E" * 5)           # after the syncfs: lost
print("ready", flush=True)
time.sleep(60)
"""


def test_power_journal_keeps_only_what_was_synced(tmp_path: Path) -> None:
    shim = build_shim(tmp_path)
    if shim is None:
        pytest.skip("no C compiler: the power-loss shim cannot be built")
    data = tmp_path / "data"
    data.mkdir()
    journal = tmp_path / "journal"
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(data / "f")], stdout=subprocess.PIPE,
                         env=dict(os.environ, **env(shim, data, journal)))
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    assert (data / "f").read_bytes().endswith(b"E" * 5)  # in the page cache until the cut
    report = lose_unsynced(journal)
    assert (data / "f").read_bytes() == b"A" * 20 + b"C" * 10 + b"A" * 70 + b"B" * 50
    assert (data / "f.2").read_bytes() == b"D" * 30
    assert report.undone_writes == 1


def test_judge_ordered_counts_order_violations_not_redeliveries() -> None:
    out = [{"ack": "a", "seq": n} for n in range(4)] + [{"ack": "b", "seq": 0}]
    got = [{"got": "a", "seq": 0}, {"got": "a", "seq": 1}, {"got": "a", "seq": 0},  # redelivery
           {"got": "a", "seq": 3}, {"got": "a", "seq": 2},  # 2 first seen after 3
           {"got": "b", "seq": 1}]  # never published, b:0 never delivered
    t = judge_ordered(out, got)
    assert t.violations == [("a", 2, 3)]
    assert t.lost == [("b", 0)]
    assert t.duplicates == 1
