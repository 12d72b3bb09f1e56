"""TLS, snappy, deflate and AUTH negotiated with a real nsqd."""

from __future__ import annotations

import pytest

from nsqx.client import ConnConfig, Connection, Consumer, NSQError, Producer
from tests.client.helpers import client_tls, run, wait_for
from tests.support.auth_server import AuthServer, Identity, grant
from tests.support.certs import TLSFiles
from tests.support.nsqd_process import NsqdFactory, NsqdProcess

FEATURES = [
    pytest.param({"snappy": True}, id="snappy"),
    pytest.param({"deflate": True, "deflate_level": 3}, id="deflate"),
    pytest.param({"tls": True}, id="tls"),
    pytest.param({"tls": True, "snappy": True}, id="tls+snappy"),
    pytest.param({"tls": True, "deflate": True}, id="tls+deflate"),
]


@pytest.fixture
def tls_nsqd(nsqd_factory: NsqdFactory, tls_files: TLSFiles) -> NsqdProcess:
    return nsqd_factory.start([f"--tls-cert={tls_files.server_cert}",
                               f"--tls-key={tls_files.server_key}"])


@pytest.mark.parametrize("features", FEATURES)
def test_round_trip_with_features(tls_nsqd: NsqdProcess, tls_files: TLSFiles,
                                  features: dict) -> None:
    opts = dict(features)
    if opts.get("tls"):
        opts["tls"] = client_tls(tls_files)
        # nsqd's TLS upgrade race (see test_tls_handshake_right_after_identify) hangs some
        # handshakes: give up on those quickly, the producer/consumer reconnect
        opts["connect_timeout"] = 1.0
    bodies = [b"small", b"z" * 200_000, bytes(range(256)) * 300]

    async def main() -> None:
        async with Producer(tls_nsqd.tcp_address, wait_timeout=15, **opts) as p:
            conn = p.connections[0]
            resp = conn.identify_response
            assert resp["tls_v1"] == bool(opts.get("tls"))
            assert resp["snappy"] == bool(opts.get("snappy"))
            assert resp["deflate"] == bool(opts.get("deflate"))
            for b in bodies:
                await p.publish("feat", b)
            await p.mpublish("feat", bodies)
        got: list[bytes] = []
        async with Consumer("feat", "ch", lambda m: got.append(m.body),
                            nsqd_tcp_addresses=tls_nsqd.tcp_address, max_in_flight=10,
                            **opts) as c:
            await wait_for(lambda: len(got) == 6, 20)
            await wait_for(lambda: c.finished == 6)
        assert sorted(got) == sorted(bodies * 2)

    run(main())


def test_tls_handshake_right_after_identify(tls_nsqd: NsqdProcess, tls_files: TLSFiles) -> None:
    """go-nsq/pynsq start the TLS handshake the moment the IDENTIFY response arrives."""

    async def main() -> None:
        ctx = client_tls(tls_files)
        hung = 0
        for _ in range(30):
            conn = Connection(tls_nsqd.tcp_address, ConnConfig(tls=ctx, connect_timeout=1.0))
            try:
                await conn.connect()
            except NSQError as e:
                assert e.code == "E_TIMEOUT"
                hung += 1
            conn.close()
            await conn.wait_closed()
        assert hung == 0, f"{hung}/30 TLS handshakes hung"

    run(main())


def test_tls_required_but_not_offered(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        p = Producer(nsqd.tcp_address, tls=True, wait_timeout=2)
        with pytest.raises(NSQError) as ei:
            await p.connect()
        assert ei.value.code == "E_TLS_UNAVAILABLE"
        await p.close()


def test_tls_bad_certificate_surfaces(tls_nsqd: NsqdProcess) -> None:
    async def main() -> None:
        # system CAs do not know the test CA: a verification error, not a retry loop
        p = Producer(tls_nsqd.tcp_address, tls=True, wait_timeout=10)
        with pytest.raises(NSQError) as ei:
            await p.connect()
        assert ei.value.code in ("E_TLS_FAILED", "E_TIMEOUT")
        await p.close()

    run(main())


@pytest.fixture
def auth_nsqd(nsqd_factory: NsqdFactory, auth_server: AuthServer) -> NsqdProcess:
    auth_server.identities["s3cret"] = Identity("alice", [grant(topic="^auth.*")])
    auth_server.identities["readonly"] = Identity(
        "bob", [grant(topic=".*", permissions=("subscribe",))])
    return nsqd_factory.start([f"--auth-http-address={auth_server.address}"])


def test_auth(auth_nsqd: NsqdProcess, auth_server: AuthServer) -> None:
    async def main() -> None:
        async with Producer(auth_nsqd.tcp_address, auth_secret="s3cret") as p:
            assert p.connections[0].auth_response["identity"] == "alice"
            await p.publish("auth_t", b"x")
            with pytest.raises(NSQError) as ei:
                await p.publish("other", b"x")
            assert ei.value.code == "E_UNAUTHORIZED"
        got: list[bytes] = []
        async with Consumer("auth_t", "ch", lambda m: got.append(m.body),
                            nsqd_tcp_addresses=auth_nsqd.tcp_address, auth_secret="s3cret"):
            await wait_for(lambda: got == [b"x"])
        # bob may subscribe, not publish
        async with Producer(auth_nsqd.tcp_address, auth_secret="readonly") as p:
            with pytest.raises(NSQError) as ei:
                await p.publish("auth_t", b"x")
            assert ei.value.code == "E_UNAUTHORIZED"
        # a wrong secret: AUTH fails at connect, the error surfaces with nsqd's code
        p = Producer(auth_nsqd.tcp_address, auth_secret="wrong", wait_timeout=3)
        with pytest.raises(NSQError) as ei:
            await p.publish("auth_t", b"x")
        assert ei.value.code == "E_AUTH_FAILED"
        await p.close()
        # no secret at all
        p = Producer(auth_nsqd.tcp_address, wait_timeout=3)
        with pytest.raises(NSQError) as ei:
            await p.connect()
        assert ei.value.code == "E_AUTH_REQUIRED"
        await p.close()
        assert "s3cret" in auth_server.secrets_seen()

    run(main())
