"""nsqlookupd's command line: both flag syntaxes, --help, --version, --config TOML, logging,
listen lines with the real ports, bind failures, graceful SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from nsqx.flags import FlagError
from nsqx.lookupd.options import Options, OptionsError, load
from tests.support.lookupd_process import lookupd_command


def run(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lookupd_command() + list(args), capture_output=True, text=True,
                          timeout=timeout)


def test_defaults():
    o, extras = load([])
    assert extras == {"help": False, "version": False}
    assert o.tcp_address == "0.0.0.0:4160"
    assert o.http_address == "0.0.0.0:4161"
    assert o.broadcast_address == socket.gethostname()
    assert o.inactive_producer_timeout == 300.0
    assert o.tombstone_lifetime == 45.0
    assert o.log_prefix == "[nsqlookupd] "
    assert o.log_level == "info"


def test_go_and_gnu_syntax():
    o, _ = load(["-tcp-address=1.2.3.4:1", "--http-address", "5.6.7.8:2",
                 "-broadcast-address", "me", "--inactive-producer-timeout=1m30s",
                 "-tombstone-lifetime=250ms", "--log-level=WARN", "-log-prefix=[x] ",
                 "-verbose"])
    assert (o.tcp_address, o.http_address, o.broadcast_address) == ("1.2.3.4:1", "5.6.7.8:2",
                                                                      "me")
    assert o.inactive_producer_timeout == 90.0
    assert o.tombstone_lifetime == 0.25
    assert o.log_level == "warn" and o.log_prefix == "[x] "


@pytest.mark.parametrize("argv", [["--nope"], ["--tombstone-lifetime=5"], ["--log-level=loud"],
                                  ["--tcp-address"], ["positional"]])
def test_bad_flags(argv):
    with pytest.raises(FlagError):
        load(argv)


def test_config_file(tmp_path):
    cfg = tmp_path / "l.toml"
    cfg.write_text('tcp_address = "127.0.0.1:9"\nhttp_address = "127.0.0.1:10"\n'
                   'inactive_producer_timeout = "10s"\ntombstone_lifetime = 2000\n'
                   'log_level = "debug"\nbroadcast_address = "cfg-host"\nunknown_key = 1\n')
    o, _ = load([f"--config={cfg}", "--http-address=127.0.0.1:11"])
    assert o.tcp_address == "127.0.0.1:9"
    assert o.http_address == "127.0.0.1:11"  # command line wins
    assert o.inactive_producer_timeout == 10.0
    assert o.tombstone_lifetime == 2.0  # a bare number is milliseconds (go-options)
    assert o.log_level == "debug" and o.broadcast_address == "cfg-host"
    bad = tmp_path / "bad.toml"
    bad.write_text("tcp_address = [")
    with pytest.raises(FlagError, match="failed to load config file"):
        load([f"--config={bad}"])
    with pytest.raises(FlagError, match="failed to load config file"):
        load([f"--config={tmp_path / 'missing.toml'}"])
    typed = tmp_path / "typed.toml"
    typed.write_text("tombstone_lifetime = true\n")
    with pytest.raises(FlagError, match="failed parsing tombstone_lifetime"):
        load([f"--config={typed}"])


def test_validate():
    with pytest.raises(OptionsError):
        Options(log_level="nope").validate()


def test_version_and_help():
    r = run("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("nsqlookupd v1.3.0 (built w/")
    r = run("-version")
    assert r.returncode == 0 and r.stdout.startswith("nsqlookupd v1.3.0 (built w/")
    r = run("--help")
    assert r.returncode == 0
    assert r.stdout.startswith("Usage of nsqlookupd:")
    for flag in ("-broadcast-address", "-config", "-http-address", "-inactive-producer-timeout",
                 "-log-level", "-log-prefix", "-tcp-address", "-tombstone-lifetime", "-version"):
        assert f"  {flag}" in r.stdout
    assert '(default "0.0.0.0:4160")' in r.stdout
    assert "(default 5m0s)" in r.stdout and "(default 45s)" in r.stdout
    r = run("-h")
    assert r.returncode == 0 and "Usage of nsqlookupd:" in r.stdout
    r = run("--bogus")
    assert r.returncode == 2
    assert "flag provided but not defined: -bogus" in r.stderr


def test_entry_point_declared():
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert data["project"]["scripts"]["nsqlookupd"] == "nsqx.cli.nsqlookupd:main"


def test_listen_lines_prefix_and_sigterm(lookupd_factory, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('log_prefix = "[LKD] "\n')
    ld = lookupd_factory.start([f"--config={cfg}"])
    log = ld.log_bytes().decode()
    assert f"TCP: listening on 127.0.0.1:{ld.tcp_port}" in log
    assert f"HTTP: listening on 127.0.0.1:{ld.http_port}" in log
    assert ld.tcp_port != 0 and ld.http_port != 0
    assert all(line.startswith("[LKD] ") for line in log.splitlines() if line)
    assert "nsqlookupd v1.3.0 (nsqx " in log  # the banner
    # a connected nsqd does not hold up a graceful stop
    s = socket.create_connection(("127.0.0.1", ld.tcp_port))
    s.sendall(b"  V1PING\n")
    assert s.recv(100) == b"\x00\x00\x00\x02OK"
    assert ld.stop() == 0
    log = ld.log_bytes().decode()
    assert "TCP: closing" in log and "HTTP: closing" in log
    assert "Traceback" not in log
    s.close()


def test_sigint_is_graceful_too(lookupd_factory):
    ld = lookupd_factory.start()
    assert ld.stop(sig=signal.SIGINT) == 0
    assert "TCP: closing" in ld.log_bytes().decode()


def test_port_in_use_fails(lookupd_factory):
    ld = lookupd_factory.start()
    r = run(f"--tcp-address=127.0.0.1:{ld.tcp_port}", "--http-address=127.0.0.1:0")
    assert r.returncode == 1
    assert f"listen (127.0.0.1:{ld.tcp_port}) failed" in r.stderr
    r = run("--tcp-address=127.0.0.1:0", f"--http-address=127.0.0.1:{ld.http_port}")
    assert r.returncode == 1
    assert f"listen (127.0.0.1:{ld.http_port}) failed" in r.stderr
    # a bad address is a bad flag now (issue 24): Go's message and exit code 2, before binding
    r = run("--tcp-address=nonsense", "--http-address=127.0.0.1:0")
    assert r.returncode == 2, r.stderr
    assert 'invalid value "nonsense" for flag -tcp-address: missing port' in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_log_level_filters(tmp_path):
    tcp, http = _free_port(), _free_port()
    log_path = tmp_path / "l.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(lookupd_command() + [
            f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}",
            "--log-level=warn"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                s = socket.create_connection(("127.0.0.1", tcp), timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        s.sendall(b"  V1NOPE\n")
        s.recv(100)
        s.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    # INFO lines (listen lines included, as upstream) are filtered at warn
    assert "INFO" not in log and "listening" not in log
    assert "invalid command NOPE" in log


def test_python_dash_m_works():
    r = subprocess.run([sys.executable, "-m", "nsqx.cli.nsqlookupd", "--version"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0 and "nsqlookupd v1.3.0" in r.stdout
