"""`nsqx topic create|describe` against a real nsqd (one node)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import http_api
from tests.support.nsqd_process import NsqdProcess


def nsqx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", *args],
                          capture_output=True, text=True, timeout=30)


def test_create_and_describe_on_one_node(nsqd: NsqdProcess) -> None:
    a = f"--nsqd-http-address={nsqd.http_address}"
    out = nsqx("topic", "create", "orders", "--partitions", "3", "--ordered", a)
    assert out.returncode == 0, out.stderr
    assert "topic orders: 3 partitions, ordered" in out.stdout
    out = nsqx("topic", "create", "orders", "--partitions", "2", a)
    assert out.returncode == 1 and "nsqd answered 400 TOPIC_EXISTS" in out.stderr
    assert http_api.pub(nsqd.http_address, "orders", b"x", partition=2).status == 200
    http_api.post(nsqd.http_address, "/channel/create", topic="orders", channel="audit")
    out = nsqx("topic", "describe", "orders", a)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "topic orders: 3 partitions, ordered, 1 messages, depth 0"
    assert "    2  messages 1  depth 0  log 0..1" in lines
    assert sum("channel audit" in line for line in lines) == 3
    data = json.loads(nsqx("topic", "describe", "orders", a, "--json").stdout)
    assert [p["partition"] for p in data["partitions"]] == [0, 1, 2]


def test_bad_use_is_explained(nsqd: NsqdProcess) -> None:
    out = nsqx("topic", "create", "t")
    assert out.returncode == 2 and "exactly one of --nsqd-http-address" in out.stderr
    out = nsqx("topic", "create", "t", "--replicas", "3",
               f"--nsqd-http-address={nsqd.http_address}")
    assert out.returncode == 2 and "need --lookupd-http-address" in out.stderr
    out = nsqx("topic", "create", "t", "--partitions", "0",
               f"--nsqd-http-address={nsqd.http_address}")
    assert out.returncode == 1 and "INVALID_PARTITION_NUM" in out.stderr
    out = nsqx("topic", "describe", "nope", f"--nsqd-http-address={nsqd.http_address}")
    assert out.returncode == 1 and "no topic nope" in out.stderr
    out = nsqx("topic", "describe", "t", "--nsqd-http-address=127.0.0.1:1")
    assert out.returncode == 1 and "cannot reach nsqd" in out.stderr
