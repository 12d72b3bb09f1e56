"""``nsqd --workers``: the option, ownership and the metadata split/merge (no processes)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from nsqx.nsqd import datapath
from nsqx.nsqd.options import OptionsError, load, parse_args
from nsqx.nsqd.workers.http_routing import merge_stats
from nsqx.nsqd.workers.ownership import merge_metadata, owner_of, split_metadata


def test_workers_option() -> None:
    assert parse_args([]).workers == 1
    assert parse_args(["--workers=3"]).workers == 3
    assert parse_args(["--workers=auto"]).workers == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("flag", ["--cluster-leadership-addresses=http://127.0.0.1:2379",
                                  "--auth-http-address=127.0.0.1:1", "--tls-required=true"])
def test_what_workers_do_not_do_yet_is_refused_at_start(flag: str, tmp_path: Path) -> None:
    args = ["--workers=2", flag]
    if "tls" in flag:
        args += [f"--tls-cert={tmp_path}/c", f"--tls-key={tmp_path}/k"]
    with pytest.raises(OptionsError, match="--workers > 1 is not supported"):
        load(args)


def test_ownership_is_stable_and_keeps_a_dlq_with_its_topic() -> None:
    assert owner_of("orders", 1) == 0
    # crc32: the same on every run and every Python (hash() is salted)
    assert [owner_of(f"t{i}", 4) for i in range(8)] == [owner_of(f"t{i}", 4) for i in range(8)]
    assert {owner_of(f"t{i}", 4) for i in range(64)} == {0, 1, 2, 3}
    for i in range(32):
        assert owner_of(f"t{i}.dlq", 3) == owner_of(f"t{i}", 3)


def _topics(path: Path) -> set[str]:
    return {t["name"] for t in orjson.loads(path.read_bytes())["topics"]}


def test_split_and_merge_move_every_topic_to_its_owner(tmp_path: Path) -> None:
    names = [f"t{i}" for i in range(20)]
    datapath.metadata_path(tmp_path).write_bytes(orjson.dumps(
        {"topics": [{"name": n, "paused": n == "t3"} for n in names], "version": "1.3.0"}))
    split_metadata(tmp_path, 3)
    assert not datapath.metadata_path(tmp_path).exists()
    for k in range(3):
        assert _topics(datapath.worker_metadata_path(tmp_path, k)) == {
            n for n in names if owner_of(n, 3) == k}
    split_metadata(tmp_path, 2)  # another N: files of workers beyond it go
    assert [p.name for p in datapath.worker_metadata_paths(tmp_path)] == [
        "nsqd.w0.dat", "nsqd.w1.dat"]
    assert _topics(datapath.worker_metadata_path(tmp_path, 1)) == {
        n for n in names if owner_of(n, 2) == 1}
    merge_metadata(tmp_path)
    assert datapath.worker_metadata_paths(tmp_path) == []
    merged = orjson.loads(datapath.metadata_path(tmp_path).read_bytes())["topics"]
    assert {t["name"] for t in merged} == set(names)
    assert [t["paused"] for t in merged if t["name"] == "t3"] == [True]


def test_merged_stats_list_each_topic_once_in_name_order() -> None:
    local = {"version": "1.3.0", "topics": [{"topic_name": "b"}], "producers": [{"id": 1}]}
    other = {"topics": [{"topic_name": "a"}, {"topic_name": "c"}],
             "producers": [{"id": 2}, {"id": 3, "user_agent": "nsqx-worker"}]}
    out = merge_stats(local, [other])
    assert [t["topic_name"] for t in out["topics"]] == ["a", "b", "c"]
    assert out["producers"] == [{"id": 1}, {"id": 2}]
