"""The README's shell blocks work as pasted.

Which blocks: every fenced ``sh`` block of README.md, and of the pages in docs/ the blocks
preceded by a ``<!-- runnable -->`` line (the others show commands for a real deployment).

How they run: the blocks of one page run in reading order, as a reader pastes them into one
terminal: each with ``bash -e -o pipefail`` in its own process group, all in one fresh
temporary directory holding a ``.venv`` symlink to a venv made the way a reader's is:
``python -m venv`` and ``pip install -e .`` of this clone, no extras (the venv running the
tests has every extra, so a block that needs one would pass here and fail for the reader).
It is made once and kept in ``build/docs-user-venv`` until pyproject.toml, setup.py or the C
source change (as scripts/setup.sh decides), pip's cache making a rebuild quick; its ``bin``
is first on PATH. The well-known ports
in the text (4150/4151 nsqd, 4160/4161 nsqlookupd, 4171 nsqadmin, 4250-4451 the cluster's
nodes, 2379/2380 etcd) are replaced by free ports, keeping their distances, so the blocks
never touch servers a developer runs on the defaults. Every block has a timeout; at the end
every process group a block started is killed (background servers included), pass or fail.

Handled apart:

* The two-commands blocks (those running ``./scripts/...``) are not executed: ``run.sh``
  serves in the foreground until Ctrl-C, and ``test.sh`` would run this suite from inside
  itself. Instead the test checks that each script they name exists, is executable and
  parses (``bash -n``), and that README still says ``./scripts/test.sh`` (what .ci/run runs).
* A block that starts a cluster (``nsqx cluster up``: etcd and four servers) runs alone in
  its own directory and is marked slow; the rest of the page is the quick test. It runs
  twice: as pasted into the reader's venv without the ``cluster`` extra, where it must stop
  at once and print the install command, then with etcd given (``NSQX_ETCD``: the binary the
  extra installs, from the venv running the tests), where it must work.
* A block that installs an extra (``pip install``) is not pasted: it would change the
  venv, and in the temporary directory ``.`` is no clone. tests/test_extras.py checks how
  install commands are written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.ports import free_block

ROOT = Path(__file__).resolve().parent.parent
RUNNABLE_MARK = "<!-- runnable -->"
BLOCK_TIMEOUT = 60.0
CLUSTER_TIMEOUT = 180.0
NO_EXTRA_TIMEOUT = 30.0  # the cluster block without etcd: fails at once, not after a wait
USER_VENV = ROOT / "build" / "docs-user-venv"  # git-ignored
# well-known ports -> offset from the base of their family
NSQ_PORTS = {p: p - 4150 for p in (4150, 4151, 4160, 4161, 4171, 4250, 4251, 4350, 4351,
                                   4450, 4451)}
ETCD_PORTS = {2379: 0, 2380: 1}
# not in the text but listened on: the HTTPS (+2) and cluster (+3) ports of the nodes
# `nsqx cluster up --base-port 4250` starts (nsqd i at 4250 + 100 i)
UNWRITTEN_OFFSETS = {100 * (i + 1) + k for i in range(3) for k in (2, 3)}
_ALTERNATIVES = "|".join(str(p) for p in sorted({*NSQ_PORTS, *ETCD_PORTS}))
_PORT_RE = re.compile(rf"(?<![\d.])({_ALTERNATIVES})(?!\d)")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # where the fence opens, 1-based
    text: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def two_commands(self) -> bool:
        return "./scripts/" in self.text

    @property
    def starts_cluster(self) -> bool:
        return "nsqx cluster up" in self.text

    @property
    def installs(self) -> bool:
        return "pip install" in self.text


def sh_blocks(page: Path, *, marked_only: bool) -> list[Block]:
    """The ```sh blocks of a Markdown page (only those after RUNNABLE_MARK if told)."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            start = i
            i += 1
            body: list[str] = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            prev = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
            if not marked_only or prev == RUNNABLE_MARK:
                out.append(Block(page.relative_to(ROOT).as_posix(), start + 1,
                                 "\n".join(body) + "\n"))
        i += 1
    return out


def pages() -> dict[str, list[Block]]:
    found = {"README.md": sh_blocks(ROOT / "README.md", marked_only=False)}
    for page in sorted((ROOT / "docs").glob("*.md")):
        blocks = sh_blocks(page, marked_only=True)
        if blocks:
            found[page.relative_to(ROOT).as_posix()] = blocks
    return found


def port_map() -> dict[str, str]:
    nsq = free_block(sorted(set(NSQ_PORTS.values()) | UNWRITTEN_OFFSETS))
    etcd = free_block(sorted(set(ETCD_PORTS.values())))
    out = {str(p): str(nsq + off) for p, off in NSQ_PORTS.items()}
    out.update({str(p): str(etcd + off) for p, off in ETCD_PORTS.items()})
    return out


def system_path() -> str:
    """PATH without the bin of the venv running the tests (its etcd, its programs)."""
    ours = str(Path(sys.executable).parent)
    return os.pathsep.join(d for d in os.environ.get("PATH", os.defpath).split(os.pathsep)
                           if d and d != ours)


def _install_inputs() -> str:
    files = ("pyproject.toml", "setup.py", "src/nsqx/_speedups.c")
    return hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in files)).hexdigest()


def make_user_venv() -> Path:
    """The reader's venv (see the module doc), made or reused -> its directory."""
    stamp = USER_VENV / ".installed"
    want = _install_inputs()
    python = USER_VENV / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text() == want:
        return USER_VENV
    shutil.rmtree(USER_VENV, ignore_errors=True)
    USER_VENV.parent.mkdir(exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)  # not this venv's python
    for cmd in ([base, "-m", "venv", str(USER_VENV)],
                [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "-e", str(ROOT)]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{cmd} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    stamp.write_text(want)
    return USER_VENV


@pytest.fixture(scope="session")
def user_venv() -> Path:
    return make_user_venv()


class Paster:
    """Runs blocks as one terminal would, in ``workdir``, with ``venv`` as the reader's
    ``.venv``; ``close()`` kills what they left."""

    def __init__(self, workdir: Path, venv: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.ports = port_map()
        self.procs: list[subprocess.Popen[bytes]] = []  # each leads its process group
        venv = venv or Path(sys.executable).parent.parent
        (workdir / ".venv").symlink_to(venv)
        self.env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{system_path()}")
        for name in ("NSQD_GO", "NSQX_ETCD", "VIRTUAL_ENV", "PYTHONPATH"):
            self.env.pop(name, None)
        self.env.update(env or {})

    def substitute(self, text: str) -> str:
        return _PORT_RE.sub(lambda m: self.ports[m.group(1)], text)

    def run(self, block: Block, timeout: float) -> str:
        """Run one block; its output, or pytest.fail when it fails or hangs."""
        script = self.substitute(block.text)
        log = self.workdir / f"block-{block.line}.out"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script],
                                    cwd=self.workdir, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            self.procs.append(proc)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
        if rc != 0:
            what = "timed out" if rc is None else f"exited {rc}"
            pytest.fail(f"{block.name} {what} when pasted; block as run:\n{script}\n"
                        f"--- its output ---\n{log.read_text(errors='replace')[-4000:]}",
                        pytrace=False)
        return log.read_text(errors="replace")

    def close(self) -> None:
        """SIGTERM to every block's process group, SIGKILL to what is left after 10 s."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            while time.monotonic() < deadline:
                proc.poll()  # reap the leader: a zombie would keep its group "alive"
                try:
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _page_params(cluster: bool) -> list[object]:
    out: list[object] = []
    for page, blocks in pages().items():
        chosen = [b for b in blocks
                  if not b.two_commands and not b.installs and b.starts_cluster == cluster]
        if cluster:
            out.extend(pytest.param(b, id=b.name, marks=pytest.mark.slow) for b in chosen)
        elif chosen:
            out.append(pytest.param(chosen, id=page))
    return out


@pytest.mark.parametrize("blocks", _page_params(cluster=False))
def test_blocks_work_pasted_in_order(blocks: list[Block], tmp_path: Path,
                                     user_venv: Path) -> None:
    paster = Paster(tmp_path, user_venv)
    try:
        for block in blocks:
            paster.run(block, BLOCK_TIMEOUT)
    finally:
        paster.close()


def _etcd_of_the_extra() -> str:
    from nsqx.cluster.etcd_server import etcd_binary  # the test venv has the extra

    return etcd_binary()


@pytest.mark.parametrize("block", _page_params(cluster=True))
def test_cluster_block_without_the_extra_says_what_to_install(
        block: Block, tmp_path: Path, user_venv: Path) -> None:
    if shutil.which("etcd", path=system_path()):
        pytest.skip("an etcd on the system PATH: the reader would not need the extra")
    paster = Paster(tmp_path, user_venv)
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            paster.run(block, NO_EXTRA_TIMEOUT)
    finally:
        paster.close()
    text = str(failed.value)
    assert " exited 1 when pasted" in text, text  # at once, not "timed out"
    assert "nsqx cluster up: no etcd binary: install it with " in text, text
    assert f"/pip install -e '{ROOT}[cluster]'" in text, text  # the reader's venv and clone


@pytest.mark.parametrize("block", _page_params(cluster=True))
def test_cluster_block_works_pasted(block: Block, tmp_path: Path, user_venv: Path) -> None:
    paster = Paster(tmp_path, user_venv, env={"NSQX_ETCD": _etcd_of_the_extra()})
    try:
        paster.run(block, CLUSTER_TIMEOUT)
    finally:
        paster.close()


def test_two_commands_name_real_scripts() -> None:
    blocks = [b for page in pages().values() for b in page if b.two_commands]
    commands = [ln.strip() for b in blocks for ln in b.text.splitlines()
                if ln.strip() and not ln.lstrip().startswith("#")]
    assert "./scripts/test.sh" in commands, "README must keep ./scripts/test.sh (.ci/run runs it)"
    for cmd in commands:
        script = ROOT / cmd.split()[0]
        assert script.is_file() and os.access(script, os.X_OK), cmd
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_port_substitution_keeps_distances() -> None:
    ports = port_map()
    assert int(ports["4151"]) - int(ports["4150"]) == 1
    assert int(ports["4451"]) - int(ports["4150"]) == 301
    assert int(ports["2380"]) - int(ports["2379"]) == 1
    text = "curl 127.0.0.1:4151/ping --base-port 4250 --etcd-port 2379 v1.4150 41500"
    paster_sub = _PORT_RE.sub(lambda m: ports[m.group(1)], text)
    assert paster_sub == (f"curl 127.0.0.1:{ports['4151']}/ping --base-port {ports['4250']} "
                          f"--etcd-port {ports['2379']} v1.4150 41500")


def test_a_broken_block_fails_and_leaves_nothing_running(tmp_path: Path) -> None:
    paster = Paster(tmp_path)
    try:
        with pytest.raises(pytest.fail.Exception, match="exited 7"):  # curl: nothing listens
            paster.run(Block("x.md", 1, "curl -sf http://127.0.0.1:4151/ping\n"), 10)
        with pytest.raises(pytest.fail.Exception, match="timed out"):
            paster.run(Block("x.md", 2, "sleep 300 &\necho $! > bg.pid\nsleep 300\n"), 1)
    finally:
        paster.close()
    stat = Path(f"/proc/{int((tmp_path / 'bg.pid').read_text())}/stat")
    # gone, or a zombie its new parent has not reaped yet
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
