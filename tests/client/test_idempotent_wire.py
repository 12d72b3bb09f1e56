"""The idempotent producer's batch on the wire and in the log's header sidecar: the fast
builders give the bytes the general ones give (no nsqd needed)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.client.idempotent import mark_command
from nsqx.protocol import v2
from nsqx.storage.publish_keys import PRODUCER_HEADER
from nsqx.storage.records import decode_headers, encode_headers

MARK = b"0123456789abcdef.0:3:17"
MARK_JSON = b'{"%s":"%s"}' % (PRODUCER_HEADER.encode(), MARK)

bodies_st = st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(bodies=bodies_st, partition=st.one_of(st.none(), st.integers(0, 65535)),
       uniform=st.booleans())
def test_marked_mpub_ext_is_what_mpub_ext_builds(bodies, partition, uniform):
    if uniform:
        bodies = [bodies[0]] * len(bodies)
    fast = mark_command("t", bodies, partition, None, MARK, True)
    general = v2.mpub_ext("t", [(MARK_JSON, bodies[0])] + [(None, b) for b in bodies[1:]],
                          partition)
    assert fast == general
    cmd = v2.CommandParser().feed(fast)[0]
    assert cmd.name == b"MPUB_EXT" and len(cmd.bodies) == len(bodies) and not cmd.stripped
    assert [v2.split_ext(b, "MPUB_EXT") for b in cmd.bodies] == (
        [({PRODUCER_HEADER: MARK}, bodies[0])] + [(None, b) for b in bodies[1:]])
    # nsqd's parser (strip_marked) cuts it once: the others' bodies without their JSON length
    cut = v2.CommandParser(strip_marked=True).feed(fast)[0]
    assert cut.stripped == (len(bodies) > 1)
    assert cut.bodies[0] == cmd.bodies[0]
    if cut.stripped:
        assert cut.bodies[1:] == bodies[1:]


headers_st = st.lists(st.one_of(st.none(), st.just({}), st.dictionaries(
    st.text(min_size=1, max_size=8), st.binary(max_size=8), min_size=1, max_size=3)),
    min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(headers=headers_st, rel_base=st.integers(0, 1000))
def test_encode_headers_of_a_marked_batch_decodes_as_the_general_encoding(headers, rel_base):
    blob = encode_headers(headers, rel_base)
    for i, h in enumerate(headers):
        assert decode_headers(blob, rel_base + i) == (h or None)
    # the one-header batch (the mark on the first message) takes the fast path: same bytes
    # as the general loop, which a batch with a second header goes through
    first = {PRODUCER_HEADER: MARK}
    one = encode_headers([first] + [None] * (len(headers) - 1), rel_base)
    two = encode_headers([first] + [None] * (len(headers) - 1) + [{"k": b"v"}], rel_base)
    assert two.startswith(one) and decode_headers(one, rel_base) == first
