"""Property tests: arbitrary input only ever raises ProtocolError, buffering stays bounded,
and results do not depend on how the stream is split."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqx.protocol import lookup_v1, v2
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.frames import FrameReader
from nsqx.protocol.v2 import FIN_BATCH, Command, CommandParser

LIMITS = {"max_body_size": 300, "max_msg_size": 60, "max_line": 64}
BOUND = LIMITS["max_line"] + 8 + LIMITS["max_body_size"]

names = st.text(alphabet="abcXYZ09._-", min_size=1, max_size=12)
ids = st.binary(min_size=16, max_size=16).map(lambda b: b.hex()[:16].encode())
small = st.binary(min_size=1, max_size=60)
positions = st.one_of(
    st.none(), st.sampled_from(["earliest", "latest", "special:-1", "special:-2", "bogus"]),
    st.builds("{}:{}".format, st.sampled_from(["timestamp", "msgcount", "virtual_queue", "offset",
                                               "special", "x"]),
              st.integers(-2, 2**64)),
    st.binary(max_size=12))

headers = st.one_of(
    st.none(), st.binary(max_size=20),
    st.dictionaries(st.sampled_from(["a", "##trace_id", "##client_dispatch_tag", "k"]),
                    st.text(alphabet="ab1-_ \x00", max_size=6), max_size=3))

command = st.one_of(
    st.builds(v2.nop),
    st.builds(v2.cls),
    st.builds(v2.rdy, st.integers(0, 3000)),
    st.builds(v2.sub, names, names),
    st.builds(v2.sub_advanced, names, names, st.integers(0, 70000), positions),
    st.builds(v2.fin, ids),
    st.builds(v2.fin, ids),
    st.builds(v2.req, ids, st.integers(0, 10**7)),
    st.builds(v2.touch, ids),
    st.builds(v2.pub, names, small),
    st.builds(v2.dpub, names, st.integers(0, 10**7), small),
    st.builds(v2.mpub, names, st.lists(small, min_size=1, max_size=4)),
    st.builds(v2.mpub, names, st.integers(1, 5).flatmap(
        lambda n: st.binary(min_size=1, max_size=20).map(lambda b: [b] * n))),
    st.builds(v2.identify, st.dictionaries(st.sampled_from(["a", "snappy"]), st.booleans(), max_size=2)),
    st.builds(v2.pub_ext, names, small, headers),
    st.builds(v2.pub_trace, names, st.integers(0, 2**64 - 1), small),
    st.builds(v2.mpub_ext, names, st.lists(st.tuples(headers, small), min_size=1, max_size=3)),
    st.builds(v2.mpub_trace, names, st.lists(st.tuples(st.integers(0, 2**64 - 1), small),
                                             min_size=1, max_size=3)),
    st.builds(v2.auth, st.binary(min_size=1, max_size=30)),
    st.sampled_from([b"FIN " + b"0" * 16 + b"\r\n", b"RDY\r\n", b"\n", b"BOGUS\n", b"PUB\n"]),
)
streams = st.lists(command, max_size=25).map(b"".join)


@st.composite
def mutated(draw):
    data = bytearray(draw(streams))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.integers(0, 2))
        i = draw(st.integers(0, len(data)))
        if op == 0 and i < len(data):
            data[i] = draw(st.integers(0, 255))
        elif op == 1:
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif i < len(data):
            del data[i : i + draw(st.integers(1, 8))]
    return bytes(data)


def split(data, cuts):
    prev = 0
    for c in sorted(cuts):
        yield data[prev:c]
        prev = c
    yield data[prev:]


def run(data, cuts, **kw):
    """Feed in pieces; returns (commands, error payload or None); checks the memory bound."""
    p = CommandParser(**LIMITS, **kw)
    out: list[Command] = []
    try:
        for piece in split(data, cuts):
            got = p.feed(piece)
            while got:
                out += got
                if got[-1].name not in (b"IDENTIFY", b"AUTH"):
                    break
                got = p.feed(b"")  # continue after the IDENTIFY/AUTH barrier
            assert p.buffered <= BOUND
    except ProtocolError as e:
        out += e.commands
        return out, e.payload
    return out, None


def expand(cmds):
    res = []
    for c in cmds:
        if c.name == FIN_BATCH:
            res += [Command(b"FIN", [i]) for i in c.params]
        else:
            res.append(c)
    return res


cuts_for = st.lists(st.integers(0, 4000), max_size=12)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(streams, cuts_for)
def test_valid_streams_chunking_invariant(data, cuts):
    whole = run(data, [])
    assert run(data, [c % (len(data) + 1) for c in cuts]) == whole
    assert run(data, list(range(len(data)))) == whole  # byte by byte
    batched = run(data, [c % (len(data) + 1) for c in cuts], batch_fin=True)
    assert (expand(batched[0]), batched[1]) == whole


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(), cuts_for)
def test_mutated_streams_only_protocol_errors(data, cuts):
    whole = run(data, [])  # anything but ProtocolError propagates and fails the test
    assert run(data, [c % (len(data) + 1) for c in cuts]) == whole
    batched = run(data, [c % (len(data) + 1) for c in cuts], batch_fin=True)
    assert (expand(batched[0]), batched[1]) == whole


@settings(max_examples=300)
@given(st.binary(max_size=2000), cuts_for)
def test_random_bytes(data, cuts):
    whole = run(data, [])
    assert run(data, [c % (len(data) + 1) for c in cuts]) == whole


@settings(max_examples=200)
@given(st.binary(max_size=500), cuts_for)
def test_random_bytes_lookup_and_frames(data, cuts):
    p = lookup_v1.LookupCommandParser(max_body_size=100, max_line=64)
    r = FrameReader(max_frame_size=100)
    for piece in split(data, [c % (len(data) + 1) for c in cuts]):
        try:
            p.feed(piece)
        except ProtocolError:
            pass
        try:
            r.feed(piece)
        except ProtocolError:
            pass
        assert p.buffered <= 64 + 4 + 100
        assert r.buffered <= 8 + 100


@settings(max_examples=100)
@given(st.lists(st.binary(min_size=1, max_size=30), min_size=1, max_size=40), st.booleans())
def test_mpub_fast_and_general_paths_agree(bodies, uniform):
    if uniform:
        bodies = [bodies[0]] * len(bodies)
    body = v2.mpub_body(bodies)
    n = len(bodies)
    fast = v2._split_uniform(body, n, 1 << 20)
    general = v2._split_general(body, n, 1 << 20)
    assert general == bodies
    if uniform:
        assert fast == bodies
    else:
        assert fast in (None, bodies)
    assert v2.split_mpub(body, 1 << 20) == bodies


def _outcome(fn, *args):
    try:
        return ("ok", [bytes(b) for b in fn(*args)])
    except ProtocolError as e:
        return ("error", e.code, e.text)


@settings(max_examples=300)
@given(st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=30),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
       st.integers(-3, 3), st.booleans())
def test_split_mpub_fast_paths_agree_with_the_checking_loop(bodies, flips, count_delta, view):
    """Whatever the body (as sent, then with bytes flipped and a wrong count: sizes
    negative, zero, huge or inconsistent, trailing bytes), split_mpub's fast paths give
    exactly what the count check + per-message checking loop gives: the same bodies, or
    the same upstream error. Max message size 20, so some bodies are too big."""
    sent = v2.mpub_body(bodies)
    hostile = bytearray(sent)
    for pos, value in flips:
        hostile[pos % len(hostile)] = value
    hostile[0:4] = max(1, len(bodies) + count_delta).to_bytes(4, "big")
    for body in (sent, bytes(hostile)):
        count = int.from_bytes(body[:4], "big")

        def reference(b: bytes, max_msg: int, count: int = count) -> list[bytes]:
            v2._check_mpub_count(count, len(b) + 4)
            return v2._split_general(b, count, max_msg)

        arg = memoryview(body) if view else body
        assert _outcome(v2.split_mpub, arg, 20) == _outcome(reference, body, 20)


@settings(max_examples=500, deadline=None)
@given(params=st.lists(st.one_of(st.binary(max_size=24), positions.map(
    lambda p: p if isinstance(p, bytes) else (p or "").encode())), max_size=6))
def test_sub_advanced_params_only_raise_protocol_errors(params):
    """What a hostile SUB_ADVANCED line can carry: a result or an upstream-style error."""
    try:
        topic, channel, partition, start = v2.parse_sub_advanced(params)
    except ProtocolError as e:
        assert e.code in ("E_INVALID", "E_BAD_TOPIC", "E_BAD_CHANNEL", "E_BAD_PARTITION")
        assert e.fatal
        return
    assert 0 <= partition <= 0xFFFF
    assert start is None or start.kind in ("earliest", "latest", "timestamp", "offset")
    assert start is None or 0 <= start.value < 2**48


@settings(max_examples=1000, deadline=None)
@given(body=st.one_of(st.binary(max_size=40), st.builds(
    lambda j, b: len(j).to_bytes(2, "big") + j + b,
    st.one_of(st.binary(max_size=30), st.sampled_from([
        b"{}", b'{"a":"b"}', b'{"##trace_id":"1"}', b'{"##trace_id":1}', b"[]", b"null",
        b'{"##client_dispatch_tag":"x y"}', b'{"a":"\\ud800"}', b"[" * 3000])),
    st.binary(max_size=5))))
def test_ext_and_trace_bodies_only_raise_protocol_errors(body):
    """Whatever an EXT/TRACE message holds: headers of strings, or an upstream-style error."""
    for split in (v2.split_ext, v2.split_trace):
        try:
            first, rest = split(body)
        except ProtocolError as e:
            assert e.code in ("E_BAD_BODY", "E_INVALID_JSON_HEADER", "INVALID_TRACE_ID",
                              "E_BAD_TAG")
            assert e.fatal == (e.code == "E_BAD_BODY")
            continue
        assert rest
        if split is v2.split_ext and first is not None:
            assert all(isinstance(k, str) and k and isinstance(v, bytes) for k, v in first.items())
            assert v2.parse_ext_json(v2.ext_json(first)) == first  # round trip
