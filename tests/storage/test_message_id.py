import pytest

from nsqx.storage.message_id import ids_for_range, make_id, parse_id, split_ids


def test_make_and_parse_roundtrip():
    mid = make_id(3, 12345)
    assert mid == b"%016x" % ((3 << 48) | 12345)
    assert len(mid) == 16 and mid.isascii()
    assert parse_id(mid) == (3, 12345)
    assert parse_id(make_id(0xFFFF, (1 << 48) - 1)) == (0xFFFF, (1 << 48) - 1)


@pytest.mark.parametrize("bad", [b"", b"0" * 15, b"0" * 17, b"000000000000000g", b"00000000000000AB"])
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        parse_id(bad)


@pytest.mark.parametrize("args", [(-1, 0), (1 << 16, 0), (0, 1 << 48), (0, -1)])
def test_make_rejects_out_of_range(args):
    with pytest.raises(ValueError):
        make_id(*args)


@pytest.mark.parametrize("count", [0, 1, 2, 17, 4096, 4097, 9000])
def test_ids_for_range_matches_make_id(count):
    ids = ids_for_range(7, 1000, count)
    assert ids == b"".join(make_id(7, 1000 + i) for i in range(count))
    assert split_ids(ids, count) == tuple(make_id(7, 1000 + i) for i in range(count))


def test_ids_for_range_rejects_overflow():
    with pytest.raises(ValueError):
        ids_for_range(0, (1 << 48) - 1, 2)
