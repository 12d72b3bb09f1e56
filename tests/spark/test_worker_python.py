"""A job run with the venv's python but without the venv on PATH (not activated) works:
Spark's workers get the driver's Python instead of ``python3`` from PATH, which lacks nsqx.
And a worker Python that cannot import nsqx is named in a clear error at register()."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests.support.nsqd_process import NsqdProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from nsqx.spark import register
    b = (SparkSession.builder.master("local[1]").appName("plain-user-job")
         .config("spark.ui.enabled", "false"))
    if len(sys.argv) > 2:
        b = b.config("spark.pyspark.python", sys.argv[2])
    spark = b.getOrCreate()
    try:
        register(spark)
        df = (spark.read.format("nsq").option("nsqd", sys.argv[1]).option("topic", "jobs")
              .option("startingOffsets", "earliest").load())
        print("ROWS " + json.dumps(sorted(r.body.decode() for r in df.collect())))
    except RuntimeError as e:
        print("REFUSED " + str(e))
    finally:
        spark.stop()
""")


def _env_without_venv() -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p).resolve() != Path(venv_bin).resolve())
    return env


def _need_java() -> None:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("no Java: Spark tests need Java 17")


def test_job_from_the_venv_python_without_activating_it(nsqd: NsqdProcess,
                                                         tmp_path: Path) -> None:
    _need_java()
    pytest.importorskip("pyspark")
    body = b"\n".join([b"one", b"two", b"three"])
    urllib.request.urlopen(urllib.request.Request(
        f"http://{nsqd.http_address}/mpub?topic=jobs", data=body, method="POST"), timeout=10)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = _env_without_venv()
    assert "nsqx" not in subprocess.run(  # the defect's setting: python3 on PATH lacks nsqx
        ["sh", "-c", "command -v python3 && python3 -c 'import nsqx' 2>&1 || true"],
        env=env, capture_output=True, text=True).stdout.split("\n")[-1]
    out = subprocess.run([sys.executable, str(job), nsqd.http_address], env=env,
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    rows = [line for line in out.stdout.splitlines() if line.startswith("ROWS ")]
    assert rows, out.stdout[-2000:] + out.stderr[-4000:]
    assert json.loads(rows[0][5:]) == ["one", "three", "two"]


def test_a_worker_python_without_nsqx_is_a_clear_error(nsqd: NsqdProcess, tmp_path: Path) -> None:
    _need_java()
    pytest.importorskip("pyspark")
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = _env_without_venv()
    env["PYSPARK_PYTHON"] = str(bare / "bin" / "python")
    out = subprocess.run([sys.executable, str(job), nsqd.http_address], env=env,
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED ")]
    assert refused, out.stdout[-2000:] + out.stderr[-4000:]
    assert "cannot import nsqx" in refused[0] and str(bare) in refused[0]
    assert f"PYSPARK_PYTHON={sys.executable}" in refused[0]


def test_a_worker_python_chosen_by_setting_is_applied_and_checked(nsqd: NsqdProcess,
                                                                  tmp_path: Path) -> None:
    """spark.pyspark.python on the user's session is the workers' Python (pyspark itself
    reads only PYSPARK_PYTHON), so a bogus one is refused by register(), naming it."""
    _need_java()
    pytest.importorskip("pyspark")
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out = subprocess.run([sys.executable, str(job), nsqd.http_address,
                          str(bare / "bin" / "python")], env=_env_without_venv(),
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED ")]
    assert refused, out.stdout[-2000:] + out.stderr[-4000:]
    assert "cannot import nsqx" in refused[0] and str(bare) in refused[0]
    assert "spark.pyspark.python" in refused[0]


def test_the_jobs_take_the_worker_python_of_spark_defaults(nsqd: NsqdProcess,
                                                           tmp_path: Path) -> None:
    """``nsqx spark ...`` does not override the executors' Python a cluster's gateway names
    in spark-defaults.conf: a bogus one there is refused, naming it (were it overridden with
    the driver's, the job would run)."""
    _need_java()
    pytest.importorskip("pyspark")
    urllib.request.urlopen(urllib.request.Request(
        f"http://{nsqd.http_address}/pub?topic=jobs", data=b"one", method="POST"), timeout=10)
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.pyspark.python {bare / 'bin' / 'python'}\n")
    out = subprocess.run([str(Path(sys.executable).with_name("nsqx")), "spark", "stats",
                          "--nsqd", nsqd.http_address, "--topic", "jobs",
                          "--conf", "spark.ui.enabled=false"],
                         env={**_env_without_venv(), "SPARK_CONF_DIR": str(conf_dir)},
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode != 0, out.stdout
    assert "cannot import nsqx" in out.stderr and str(bare) in out.stderr, out.stderr[-4000:]
