"""Self-signed TLS material for tests: a CA, a server cert for 127.0.0.1/localhost, a client cert.

Made with the ``openssl`` command line tool (present wherever Python's ssl module is built, and in
every CI image we use), so the tests need no extra Python package. EC P-256 keys keep it fast.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_SAN = "IP:127.0.0.1,DNS:localhost"


@dataclass(frozen=True)
class TLSFiles:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_cn: str


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(
            f"openssl {' '.join(args)} failed ({res.returncode}):\n"
            f"{res.stderr.decode(errors='replace')}"
        )


def _new_key(path: Path, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(path), cwd=cwd)


def _sign(name: str, cn: str, ext: str, serial: int, d: Path) -> tuple[Path, Path]:
    key, csr, cert, extfile = (d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem",
                               d / f"{name}.ext")
    _new_key(key, d)
    _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", f"/CN={cn}", cwd=d)
    extfile.write_text(ext)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(d / "ca.pem"), "-CAkey",
             str(d / "ca.key"), "-set_serial", str(serial), "-days", "3650", "-sha256",
             "-extfile", str(extfile), "-out", str(cert), cwd=d)
    return cert, key


def make_tls_files(directory: Path, client_cn: str = "nsqx-test-client") -> TLSFiles:
    """Create CA, server and client certificates in ``directory`` (created if missing)."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command line tool is needed to make test certificates")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _new_key(d / "ca.key", d)
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-out", "ca.pem", "-days", "3650",
             "-sha256", "-subj", "/CN=nsqx test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    server_cert, server_key = _sign(
        "server", "localhost",
        f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={SERVER_SAN}\n",
        2, d)
    client_cert, client_key = _sign(
        "client", client_cn,
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
        3, d)
    return TLSFiles(ca_cert=d / "ca.pem", ca_key=d / "ca.key", server_cert=server_cert,
                    server_key=server_key, client_cert=client_cert, client_key=client_key,
                    client_cn=client_cn)
