"""nsqlookupd in cluster mode (nsqx.cluster.lookupd_api): ``/lookup`` of a topic etcd does
not know is answered by the lookupd's own registry (``lookupd.http.registry_lookup``)."""

from __future__ import annotations

from nsqx.cluster.etcd_server import EtcdServer
from tests.support.cluster import Cluster, http


def test_lookup_of_a_topic_etcd_does_not_know_is_the_registrys_answer(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=0)
    base = f"http://{cluster.lookupd.http_address}"
    code, body = http("GET", f"{base}/lookup")
    assert (code, body) == (400, {"message": "MISSING_ARG_TOPIC"})
    code, body = http("GET", f"{base}/lookup?topic=plain")
    assert (code, body) == (404, {"message": "TOPIC_NOT_FOUND"})
