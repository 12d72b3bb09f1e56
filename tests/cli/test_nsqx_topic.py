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


def test_create_with_an_fsync_policy(nsqd: NsqdProcess) -> None:
    a = f"--nsqd-http-address={nsqd.http_address}"
    out = nsqx("topic", "create", "ledger", "--partitions", "2", "--sync-every", "1", a)
    assert out.returncode == 0, out.stderr
    st = http_api.stats(nsqd.http_address, "ledger")["topics"][0]
    assert st["sync_every"] == 1
    out = nsqx("topic", "create", "other", "--sync-every", "-3", a)
    assert out.returncode == 2 and "--sync-every must be >= 0" in out.stderr


def test_bad_use_is_explained(nsqd: NsqdProcess) -> None:
    out = nsqx("topic", "create", "t", f"--nsqd-http-address={nsqd.http_address}",
               "--lookupd-http-address=127.0.0.1:1")
    assert out.returncode == 2 and "not both" in out.stderr
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


def test_route_changes_from_the_command_line(nsqd: NsqdProcess) -> None:
    """`nsqx topic routes|split|merge|move` on a route-managed ordered topic; refusals are
    printed with nsqd's reason and exit 1."""
    a = f"--nsqd-http-address={nsqd.http_address}"
    assert http_api.post(nsqd.http_address, "/topic/create", topic="keyed", partition_num="1",
                         logical="64").status == 200
    out = nsqx("topic", "split", "keyed", "0", "--at", "32", a)
    assert out.returncode == 0, out.stderr
    assert "      1" in out.stdout and "0-31 -> 1 @ " in out.stdout and "32-63 -> 2 @ " in out.stdout
    out = nsqx("topic", "merge", "keyed", "1", "2", a)
    assert out.returncode == 0, out.stderr
    assert "0-63 -> 3 @ " in out.stdout
    out = nsqx("topic", "move", "keyed", "3", "--to", "elsewhere:4150", a)
    assert out.returncode == 0, out.stderr
    assert "0-63 -> 4 @ elsewhere:4150" in out.stdout
    out = nsqx("topic", "routes", "keyed", a)
    assert out.returncode == 0, out.stderr
    rows = [line.split()[0] for line in out.stdout.splitlines()[2:] if line.strip()[:1].isdigit()]
    assert rows == ["0", "1", "2", "3"]
    data = json.loads(nsqx("topic", "routes", "keyed", a, "--json").stdout)
    assert [v["version"] for v in data["versions"]] == [0, 1, 2, 3]
    # refusals: a retired partition, a bad boundary, a non-route topic
    out = nsqx("topic", "split", "keyed", "0", "--at", "10", a)
    assert out.returncode == 1 and "nsqd answered 400" in out.stderr
    out = nsqx("topic", "split", "keyed", "4", "--at", "64", a)
    assert out.returncode == 1 and "nsqd answered 400" in out.stderr
    http_api.post(nsqd.http_address, "/topic/create", topic="plain")
    out = nsqx("topic", "merge", "plain", "0", "1", a)
    assert out.returncode == 1 and "TOPIC_NOT_ROUTE_MANAGED" in out.stderr
    out = nsqx("topic", "routes", "keyed", "--nsqd-http-address=127.0.0.1:1")
    assert out.returncode == 1 and "cannot reach nsqd" in out.stderr
