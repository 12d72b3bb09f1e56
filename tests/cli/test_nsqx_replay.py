"""``nsqx channel reset`` and ``nsqx message get`` against a real nsqd."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from nsqx.cli.nsqx_cmd import main
from nsqx.protocol import v2
from tests.support import http_api
from tests.support.nsqd_process import NsqdProcess
from tests.support.rawclient import consumer


def seed(node: NsqdProcess, n: int = 6) -> None:
    assert http_api.post(node.http_address, "/topic/create", topic="t").status == 200
    assert http_api.post(node.http_address, "/channel/create", topic="t",
                         channel="c").status == 200
    assert http_api.mpub(node.http_address, "t", [b"m%d" % i for i in range(n)]).status == 200


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_channel_reset_to_offset_earliest_latest(nsqd: NsqdProcess, capsys) -> None:
    seed(nsqd)
    addr = ["--nsqd-http-address", nsqd.http_address]
    code, out, _ = run(capsys, "channel", "reset", "t", "c", "--to-offset", "4", *addr)
    assert code == 0
    assert out.splitlines()[0] == "t/c partition 0: reset to offset 4 (log holds 0..6)"
    with consumer(nsqd.tcp_address, "t", "c", rdy=0) as c:
        code, out, _ = run(capsys, "channel", "reset", "t", "c", "--latest", "--json", *addr)
        assert json.loads(out)["offset"] == 6
        code, out, _ = run(capsys, "channel", "reset", "t", "c", "--earliest", *addr)
        assert "reset to offset 0" in out
        c.send(v2.rdy(10))
        assert [m.body for m in c.read_messages(6)] == [b"m%d" % i for i in range(6)]


def test_channel_reset_to_time(nsqd: NsqdProcess, capsys) -> None:
    seed(nsqd, 3)
    addr = ["--nsqd-http-address", nsqd.http_address]
    code, out, _ = run(capsys, "channel", "reset", "t", "c", "--to-time", "2001-01-01T00:00",
                       "--json", *addr)
    assert code == 0 and json.loads(out)["offset"] == 0
    future = datetime.fromtimestamp(4_000_000_000, UTC).isoformat()
    code, out, _ = run(capsys, "channel", "reset", "t", "c", "--to-time", future, "--json",
                       *addr)
    assert json.loads(out)["offset"] == 3
    code, out, _ = run(capsys, "channel", "reset", "t", "c", "--to-time", "1000", "--json",
                       *addr)  # ms since the epoch
    assert json.loads(out)["offset"] == 0


@pytest.mark.parametrize("argv,code,err", [
    (["t", "c", "--to-offset", "99"], 1, "nsqd answered 400 OFFSET_OUT_OF_RANGE"),
    (["t", "nope", "--latest"], 1, "nsqd answered 404 CHANNEL_NOT_FOUND"),
    (["nope", "c", "--latest"], 1, "nsqd answered 404 TOPIC_NOT_FOUND"),
    (["t", "c", "--latest", "--partition", "3"], 1, "nsqd answered 400 E_BAD_PARTITION"),
    (["t", "c", "--to-time", "yesterday"], 2, "bad time 'yesterday'"),
    (["t", "c", "--to-time", "1960-01-01T00:00"], 2, "--to-time before 1970"),
])
def test_channel_reset_errors(nsqd: NsqdProcess, capsys, argv: list[str], code: int,
                              err: str) -> None:
    seed(nsqd, 3)
    got, _, stderr = run(capsys, "channel", "reset", *argv, "--nsqd-http-address",
                         nsqd.http_address)
    assert got == code and err in stderr


@pytest.mark.parametrize("argv", [
    ["t", "c"],  # no position
    ["t", "c", "--earliest", "--latest"],
    ["t", "c", "--to-offset", "-1"],
    ["t", "c", "--to-offset", "x"],
    ["t", "--latest"],
])
def test_channel_reset_usage_errors(capsys, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["channel", "reset", *argv, "--nsqd-http-address", "127.0.0.1:1"])
    assert ei.value.code == 2


def test_unreachable_nsqd(capsys) -> None:
    code, _, err = run(capsys, "channel", "reset", "t", "c", "--latest",
                       "--nsqd-http-address", "127.0.0.1:1")
    assert code == 1 and "cannot reach nsqd at 127.0.0.1:1" in err


def test_message_get(nsqd: NsqdProcess, capsys) -> None:
    seed(nsqd, 3)
    addr = ["--nsqd-http-address", nsqd.http_address]
    code, out, _ = run(capsys, "message", "get", "t", "0000000000000001", *addr)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "id         0000000000000001"
    assert lines[2] == "offset     1"
    assert lines[4] == "attempts   1"
    assert lines[-2:] == ["body       2 bytes:", "m1"]
    code, out, _ = run(capsys, "message", "get", "t", "--offset", "2", "--json", *addr)
    assert json.loads(out)["body"] == "m2"
    # --raw writes the bytes themselves (checked through a real stdout)
    r = subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", "message", "get", "t",
                        "--offset", "0", "--raw", *addr], capture_output=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, b"m0")


@pytest.mark.parametrize("argv,code,err", [
    (["t", "0000000000000009"], 1, "nsqd answered 404 MESSAGE_NOT_FOUND"),
    (["t", "zz"], 1, "nsqd answered 400 E_INVALID"),
    (["t", "--offset", "0", "--partition", "2"], 1, "nsqd answered 400 E_BAD_PARTITION"),
    (["t"], 2, "give either a message ID or --offset N"),
    (["t", "0000000000000000", "--offset", "1"], 2, "give either a message ID or --offset N"),
])
def test_message_get_errors(nsqd: NsqdProcess, capsys, argv: list[str], code: int,
                            err: str) -> None:
    seed(nsqd, 3)
    got, _, stderr = run(capsys, "message", "get", *argv, "--nsqd-http-address",
                         nsqd.http_address)
    assert got == code and err in stderr


def test_help_texts(capsys) -> None:
    for argv in (["channel", "reset", "--help"], ["message", "get", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert "--nsqd-http-address" in out and "examples:" in out
