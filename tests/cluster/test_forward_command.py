"""The commands a follower forwards: parsed back by nsqd's own parser, they carry the same
partition, bodies, headers and trace ids as the publish the follower received."""

from __future__ import annotations

from nsqx.cluster.forward import forward_command, split_replayed, traced_offset
from nsqx.protocol import v2
from nsqx.protocol.forward import REPLAYED_SUFFIX


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


def test_deferred_with_headers_or_several_carries_its_delay_as_a_header() -> None:
    """DPUB takes one message and no header: an idempotent deferred publish (its mark) or
    a batch goes as PUB_EXT/MPUB_EXT naming its partition, the delay in ##nsqx_defer."""
    cmd = parse(forward_command("t", 3, [b"x"], 10, [{"nsqx-pub": b"h/k#1#f"}]))
    assert (cmd.name, cmd.params) == (b"PUB_EXT", [b"t", b"3"])
    assert v2.split_ext(cmd.body) == ({"nsqx-pub": b"h/k#1#f", v2.DEFER_KEY: b"10"}, b"x")
    cmd = parse(forward_command("t", None, [b"x", b"y"], 10))
    assert cmd.name == b"MPUB_EXT"
    assert [v2.split_ext(b) for b in cmd.bodies] == [({v2.DEFER_KEY: b"10"}, b"x"),
                                                     (None, b"y")]
    # trace ids only, deferred: not MPUB_TRACE (which has no room for the delay)
    cmd = parse(forward_command("t", 0, [b"x", b"y"], 5, [{"##trace_id": b"9"}, None]))
    assert cmd.name == b"MPUB_EXT"
    assert v2.split_ext(cmd.bodies[0]) == ({"##trace_id": b"9", v2.DEFER_KEY: b"5"}, b"x")


def test_asking_whether_a_marked_batch_was_a_repeat() -> None:
    headers = [{"nsqx-pub": b"h/k#2#f"}, None]
    cmd = parse(forward_command("t", 1, [b"a", b"b"], 0, headers, ask_replayed=True))
    assert (cmd.name, cmd.params) == (b"MPUB_EXT", [b"t", b"1"])
    assert v2.split_ext(cmd.bodies[0])[0] == {"nsqx-pub": b"h/k#2#f",
                                             v2.ASK_REPLAYED_KEY: b"1"}
    assert headers[0] == {"nsqx-pub": b"h/k#2#f"}  # the caller's headers stay as they were
    cmd = parse(forward_command("t", None, [b"a"], 0, [{"nsqx-pub": b"h/k#1#f"}],
                                ask_replayed=True))
    assert cmd.name == b"PUB_EXT" and v2.ASK_REPLAYED_KEY in v2.split_ext(cmd.body)[0]
    assert split_replayed(b"OK REPLAYED") == (b"OK", True)
    assert split_replayed(b"OK") == (b"OK", False)
    traced = v2.traced_response(5, 7, 1234, 40)
    assert split_replayed(traced + REPLAYED_SUFFIX) == (traced, True)


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
