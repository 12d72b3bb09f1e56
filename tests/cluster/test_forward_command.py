"""The commands a follower forwards: parsed back by nsqd's own parser, they carry the same
partition, bodies, headers and trace ids as the publish the follower received."""

from __future__ import annotations

import pytest

from nsqx.cluster.forward import forward_command, traced_offset
from nsqx.protocol import v2


def parse(data: bytes) -> v2.Command:
    (cmd,) = v2.CommandParser().feed(data)
    return cmd


def test_plain_publishes_keep_the_partition() -> None:
    cmd = parse(forward_command("t", None, [b"a"], 0))
    assert (cmd.name, cmd.params, cmd.body) == (b"PUB", [b"t"], b"a")
    cmd = parse(forward_command("t", 2, [b"a"], 0))
    assert (cmd.name, cmd.params) == (b"PUB", [b"t", b"2"])
    cmd = parse(forward_command("t", 1, [b"a", b"bb"], 0))
    assert (cmd.name, cmd.params, cmd.bodies) == (b"MPUB", [b"t", b"1"], [b"a", b"bb"])


def test_deferred_goes_as_dpub_without_partition() -> None:
    cmd = parse(forward_command("t", 3, [b"x"], 1500))
    assert (cmd.name, cmd.params, cmd.body) == (b"DPUB", [b"t", b"1500"], b"x")
    with pytest.raises(ValueError):
        forward_command("t", None, [b"x", b"y"], 10)
    with pytest.raises(ValueError):
        forward_command("t", None, [b"x"], 10, [{"k": b"v"}])


def test_headers_and_trace_ids_survive() -> None:
    cmd = parse(forward_command("t", 1, [b"a"], 0, [{"k": b"v", "##trace_id": b"7"}]))
    assert (cmd.name, cmd.params) == (b"PUB_EXT", [b"t", b"1"])
    assert v2.split_ext(cmd.body) == ({"k": b"v", "##trace_id": b"7"}, b"a")
    cmd = parse(forward_command("t", None, [b"a", b"b"], 0, [{"##trace_id": b"9"}, None]))
    assert cmd.name == b"MPUB_TRACE"
    assert [v2.split_trace(b) for b in cmd.bodies] == [(9, b"a"), (0, b"b")]
    cmd = parse(forward_command("t", 0, [b"a", b"b"], 0, [{"k": b"v"}, None]))
    assert (cmd.name, cmd.params) == (b"MPUB_EXT", [b"t", b"0"])
    assert [v2.split_ext(b) for b in cmd.bodies] == [({"k": b"v"}, b"a"), (None, b"b")]


def test_traced_offset() -> None:
    assert traced_offset(v2.traced_response(5, 7, 1234, 40)) == 1234
    assert traced_offset(b"OK") == -1
