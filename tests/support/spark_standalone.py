"""A real standalone Spark cluster for the tests: one master and one worker started from
pyspark's own jars (``bin/spark-class``), bound to loopback on free ports, stopped (their
process groups, executors included) afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from nsqx.cluster.etcd_server import free_port
from tests.support.seaweed import stop_group


def spark_home() -> str:
    import pyspark  # noqa: PLC0415

    return str(Path(pyspark.__file__).parent)


class SparkStandalone:
    def __init__(self, work: Path) -> None:
        self.work = Path(work)
        self.port, self.ui = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
                   SPARK_LOG_DIR=str(self.work / "logs"), SPARK_WORKER_DIR=str(self.work / "w"),
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
        return env

    def _spawn(self, name: str, args: list[str]) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.work / f"{name}.log", "wb") as log:
            self.procs.append(subprocess.Popen(
                [f"{spark_home()}/bin/spark-class", *args], stdout=log, stderr=subprocess.STDOUT,
                env=self.env(), start_new_session=True))

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as r:
            return json.loads(r.read())

    def start(self, timeout: float = 120.0) -> SparkStandalone:
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui)])
        taken = {self.port, self.ui}  # not bound yet by the master: free_port may pick them
        worker_ports = []
        while len(worker_ports) < 2:
            port = free_port()
            if port not in taken:
                taken.add(port)
                worker_ports.append(port)
        self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--port", str(worker_ports[0]),
                               "--webui-port", str(worker_ports[1]),
                               "--cores", "2", "--memory", "1g",
                               "--work-dir", str(self.work / "w"), self.master_url])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited ({p.returncode}); logs in "
                                       f"{self.work}")
            try:
                if self.state().get("aliveworkers") == 1:
                    return self
            except (OSError, ValueError):  # not up yet, or a page that is not the JSON yet
                pass
            time.sleep(0.5)
        raise RuntimeError(f"standalone Spark not up after {timeout}s; logs in {self.work}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            stop_group(p, 20)
