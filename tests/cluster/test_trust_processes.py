"""Only a node can speak as a node: forged replication and route requests against a real
cluster (etcd, nsqlookupd, three nsqd with a shared --cluster-secret-file).

The impersonation that made a leader acknowledge publishes only it held (issue 23): both
followers stopped, a plain HTTP client fetching at the leader's log end in their names.
"""

from __future__ import annotations

import base64
import json
import signal
import time
import urllib.parse
from typing import Any

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from nsqx.cluster.trust import Signer, generate_secret_file
from tests.support.cluster import Cluster, http, publish_with_followers_stopped, wait_until

pytestmark = pytest.mark.slow

FETCH = "/nsqx/replica/fetch"


@pytest.fixture
def cluster(etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)


def pub(node, topic: str, body: bytes) -> int:  # type: ignore[no-untyped-def]
    return http("POST", f"http://{node.http_address}/pub?topic={topic}", body, timeout=15)[0]


def get(url: str, query: dict[str, Any], headers: dict[str, str] | None = None
        ) -> tuple[int, Any]:
    q = {k: str(v) for k, v in query.items()}
    return http("GET", f"{url}?{urllib.parse.urlencode(q)}", headers=headers, timeout=5)


def test_impersonated_followers_acknowledge_nothing(cluster: Cluster) -> None:
    cluster.create_topic("imp", partitions=1, replicas=3)
    leader = cluster.leader("imp")
    followers = [n for n in cluster.nodes if n is not leader]
    ids = [cluster.node_id(f) for f in followers]
    assert pub(leader, "imp", b"before") == 200
    epoch = cluster.partitions("imp")[0]["epoch"]
    state = cluster.state(leader)
    targets = [f"http://{leader.http_address}{FETCH}", f"http://{state['cluster_address']}{FETCH}"]
    wrong = [Signer(b"not the cluster secret, but long", fid) for fid in ids]
    statuses: list[int] = []

    def forge() -> None:
        """A client that knows everything public (ids, epoch, log end) but the secret."""
        end = cluster.state(leader)["partitions"][0]["log_end"]
        for fid, bad in zip(ids, wrong, strict=True):
            q = {"topic": "imp", "partition": 0, "epoch": epoch, "node": fid,
                 "offset": end, "wait_ms": 0}
            for url in targets:
                statuses.append(get(url, q)[0])
                statuses.append(get(url, q, bad.headers("GET", FETCH, {
                    k: str(v) for k, v in q.items()}))[0])

    results = publish_with_followers_stopped(cluster, "imp", forge, lambda: len(statuses) > 20)
    assert results.count(200) == 0, f"{results.count(200)} publishes acked by one replica"
    assert statuses and set(statuses) <= {401, 403}, sorted(set(statuses))
    st = cluster.state(leader)
    assert st["refused"].get("E_CLUSTER_PORT") and st["refused"].get("E_UNAUTHENTICATED") \
        and st["refused"].get("E_BAD_SIGNATURE"), st["refused"]
    # warned about once per kind and caller address, not once per request
    warned = [ln for ln in leader.log_bytes().decode().splitlines()
              if f"refused {FETCH} from 127.0.0.1" in ln]
    assert 3 <= len(warned) <= 4, warned
    # the stopped followers come back: they register again, catch up and rejoin the ISR
    wait_until(lambda: len(cluster.partitions("imp")[0]["isr"]) == 3, timeout=60,
               what="the followers back in the ISR")
    assert pub(leader, "imp", b"after") == 200


def test_each_forged_request_is_refused_clearly_and_counted(cluster: Cluster) -> None:
    cluster.create_topic("forged", partitions=1, replicas=3)
    leader, follower, other = cluster.roles("forged")
    fid, oid = cluster.node_id(follower), cluster.node_id(other)
    assert pub(leader, "forged", b"x") == 200
    epoch = cluster.partitions("forged")[0]["epoch"]
    end = cluster.state(leader)["partitions"][0]["log_end"]
    q = {"topic": "forged", "partition": 0, "epoch": epoch, "node": fid, "offset": end,
         "wait_ms": 0}
    addr = cluster.state(leader)["cluster_address"]
    base = f"http://{addr}"
    sq = {k: str(v) for k, v in q.items()}

    def check(got: tuple[int, Any], status: int, code: str) -> None:
        assert got[0] == status and got[1]["message"] == code, got

    check(get(base + FETCH, q), 401, "E_UNAUTHENTICATED")                       # no credential
    bad = Signer(b"guessed secret, quite long enough", fid)
    check(get(base + FETCH, q, bad.headers("GET", FETCH, sq)), 401, "E_BAD_SIGNATURE")
    h = cluster.signer(fid).headers("GET", FETCH, sq, to=addr)                    # a member's
    assert get(base + FETCH, q, h)[0] == 200
    check(get(base + FETCH, q, h), 401, "E_REPLAYED")                            # replayed
    check(cluster.internal(leader, "GET", FETCH, q, as_node=oid), 403, "E_NODE_MISMATCH")
    check(cluster.internal(leader, "GET", FETCH, {**q, "epoch": epoch - 1}, as_node=fid),
          409, "E_STALE_EPOCH")
    check(cluster.internal(leader, "GET", FETCH, {**q, "node": "ghost"}, as_node="ghost"),
          403, "E_NOT_REGISTERED")                                              # never joined
    # the public port serves none of it, whoever signs; the read-only state stays readable
    check(http("GET", f"http://{leader.http_address}{FETCH}?"
                      f"{urllib.parse.urlencode(sq)}"), 403, "E_CLUSTER_PORT")
    check(http("POST", f"http://{leader.http_address}/nsqx/route/seal?topic=forged&"
                       "partition=0&version=1"), 403, "E_CLUSTER_PORT")
    check(http("POST", f"{base}/nsqx/route/reset/release?topic=forged&channel=c"),
          401, "E_UNAUTHENTICATED")
    # a follower whose lease ended is not a member until it registers again, whoever asks
    follower.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: fid not in {n["id"] for n in cluster.stats()["nodes"]}, timeout=30,
                   what="the stopped follower's lease ended")
        end = cluster.state(leader)["partitions"][0]["log_end"]
        check(cluster.internal(leader, "GET", FETCH, {**q, "offset": end}, as_node=fid),
              403, "E_NOT_REGISTERED")
    finally:
        follower.signal(signal.SIGCONT)
    wait_until(lambda: fid in cluster.partitions("forged")[0]["isr"], timeout=60,
               what="the follower registered again and back in the ISR")
    code, metrics = http("GET", f"http://{leader.http_address}/metrics")
    assert code == 200
    for reason in ("E_UNAUTHENTICATED", "E_BAD_SIGNATURE", "E_REPLAYED", "E_NODE_MISMATCH",
                   "E_STALE_EPOCH", "E_NOT_REGISTERED", "E_CLUSTER_PORT"):
        assert f'nsqx_cluster_refused_requests_total{{reason="{reason}"}}' in metrics, reason
    assert "nsqd_topic_message_count" in metrics or "nsqd_info" in metrics  # nsqd's own too


def test_without_a_secret_members_still_work_and_warn(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:  # type: ignore[no-untyped-def]
    """The compatible mode: unauthenticated, warned about at start; still, only a registered
    node's fetch counts."""
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory, secret=False).start(nodes=3)
    cluster.create_topic("open", partitions=1, replicas=3)
    leader = cluster.leader("open")
    assert pub(leader, "open", b"x") == 200
    assert "no --cluster-secret-file" in leader.log_bytes().decode()
    epoch = cluster.partitions("open")[0]["epoch"]
    got = get(f"http://{leader.http_address}{FETCH}", {
        "topic": "open", "partition": 0, "epoch": epoch, "node": "ghost", "offset": 0})
    assert got[0] == 403 and got[1]["message"] == "E_NOT_REGISTERED", got


def test_a_member_with_another_secret_is_told_once(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A node given the wrong secret file registers, but its fetches (or its followers'
    fetches, if it leads) are refused: a warning that says why, once a minute."""
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=2)
    good = cluster.secret_file
    cluster.secret_file = str(generate_secret_file(tmp_path / "other.secret"))
    try:
        cluster.add_node()
    finally:
        cluster.secret_file = good
    wait_until(lambda: len(cluster.stats()["nodes"]) == 3, what="three nodes registered")
    cluster.create_topic("mixed", partitions=1, replicas=3)

    def warnings() -> list[str]:
        return [ln for n in cluster.nodes for ln in n.log_bytes().decode().splitlines()
                if "refuses this node's fetches" in ln]

    wait_until(warnings, timeout=20, what="a refused member's warning")
    time.sleep(2)  # it keeps retrying; the warning is not repeated
    found = warnings()
    assert 1 <= len(found) <= 2 and "E_BAD_SIGNATURE" in found[0], found


def test_a_lower_fetch_does_not_move_a_followers_progress_back(cluster: Cluster) -> None:
    """Issue 31: a fetch at a lower offset lowered a follower's recorded progress and with it
    ``acked_end`` (3 -> 0). Within one registration of the follower it is refused now."""
    cluster.create_topic("prog", partitions=1, replicas=3)
    leader, follower, _ = cluster.roles("prog")
    fid = cluster.node_id(follower)
    for i in range(3):
        assert pub(leader, "prog", b"m%d" % i) == 200

    def mine() -> dict[str, Any]:
        return cluster.state(leader)["partitions"][0]

    wait_until(lambda: mine()["followers"].get(fid, 0) >= 3, what="the follower at 3")
    epoch = cluster.partitions("prog")[0]["epoch"]
    got = cluster.internal(leader, "GET", FETCH, {"topic": "prog", "partition": 0,
                                                  "epoch": epoch, "node": fid, "offset": 0,
                                                  "wait_ms": 0}, as_node=fid)
    assert got[0] == 409 and got[1]["message"] == "E_OFFSET_REGRESSED", got
    now = mine()
    assert now["acked_end"] >= 3 and now["followers"][fid] >= 3, now
    assert cluster.state(leader)["refused"].get("E_OFFSET_REGRESSED") == 1
    assert pub(leader, "prog", b"after") == 200  # the real follower keeps acknowledging


def test_a_forged_isr_in_etcd_is_repaired_and_publishes_work_again(
        etcd_server: EtcdServer, cluster: Cluster) -> None:
    """Issue 31: a PUT to the partition record naming an ISR of a node that does not exist
    made every publish fail (E_PUB_FAILED), and the coordinator did not repair it."""
    cluster.create_topic("t3", partitions=1, replicas=3)
    leader = cluster.leader("t3")
    assert pub(leader, "t3", b"before") == 200
    key = f"/nsqx/{cluster.cluster_id}/partitions/t3/0"
    code, got = http("POST", f"{etcd_server.endpoint}/v3/kv/range",
                     json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode())
    assert code == 200, got
    record = json.loads(base64.b64decode(got["kvs"][0]["value"]))
    forged = {**record, "isr": ["ghost"], "catchup": []}
    code, got = http("POST", f"{etcd_server.endpoint}/v3/kv/put", json.dumps({
        "key": base64.b64encode(key.encode()).decode(),
        "value": base64.b64encode(json.dumps(forged).encode()).decode()}).encode())
    assert code == 200, got
    wait_until(lambda: "ghost" not in cluster.partitions("t3")[0]["isr"]
               and cluster.partitions("t3")[0]["leader"] == record["leader"], timeout=30,
               what="the coordinator repaired the forged ISR")
    wait_until(lambda: pub(leader, "t3", b"after") == 200, timeout=60,
               what="publishes acknowledged again")
    assert "metadata contradicted the live replicas" in cluster.lookupd.log_bytes().decode()
