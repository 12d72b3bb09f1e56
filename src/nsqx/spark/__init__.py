"""nsqx on Apache Spark: the ``nsq`` PySpark data source and jobs built on it.

    from nsqx.spark import register
    register(spark)
    df = (spark.read.format("nsq").option("nsqd", "127.0.0.1:4151").option("topic", "events")
          .load())

See :mod:`nsqx.spark.source` for the options and the schema, :mod:`nsqx.spark.jobs` for the
``nsqx spark archive`` / ``nsqx spark stats`` jobs. ``pyspark`` and ``pyarrow`` come with the
``spark`` extra (in a clone: ``.venv/bin/pip install -e '.[spark]'``); the package must be installed in the Python
that Spark's workers run (``PYSPARK_PYTHON``), as every Python data source must.
"""

from __future__ import annotations

from typing import Any

from nsqx.extras import install_command

__all__ = ["register", "NsqDataSource"]


def register(spark: Any) -> None:
    """Register the ``nsq`` data source on a SparkSession (registration is per session).

    Spark runs Python data sources in worker processes started with ``PYSPARK_PYTHON``, or
    with ``python3`` from PATH when that is unset, which is not the virtualenv when a user
    runs ``.venv/bin/python job.py`` without activating it: the workers then fail with
    ``No module named 'nsqx'`` deep in a stack trace. So when nobody chose the workers'
    Python, they get the driver's (which has nsqx); when somebody chose one that cannot
    import nsqx, this says so at once. (Spark Connect sessions configure workers on the
    server and are left alone.)
    """
    _use_driver_python(spark)
    spark.dataSource.register(_data_source())


def _use_driver_python(spark: Any) -> None:
    import os
    import subprocess
    import sys

    try:
        sc = spark.sparkContext
        current = sc.pythonExec
    except Exception:  # Spark Connect: no local SparkContext
        return
    if current is None:
        return
    try:
        conf_python = spark.conf.get("spark.pyspark.python", None)
    except Exception:
        conf_python = None
    if conf_python:
        # Spark ranks this setting above PYSPARK_PYTHON, but pyspark reads only the
        # environment for its workers: apply it here (and check it below)
        current = sc.pythonExec = conf_python
    elif not os.environ.get("PYSPARK_PYTHON") and current == "python3":
        sc.pythonExec = sys.executable  # read by every Python function wrapped from now on
        return
    master = str(sc.master or "")
    if not master.startswith("local") or current == sys.executable:
        return  # executors elsewhere: their Python is theirs to configure
    try:
        ok = subprocess.run([current, "-c", "import nsqx, pyarrow, numpy"],
                            capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise RuntimeError(
            f"Spark's Python workers run {current!r} (PYSPARK_PYTHON or spark.pyspark.python), "
            "which cannot import "
            f"nsqx with its Spark extra (pyarrow, numpy); install it there "
            f"({install_command('spark', current)}), or set "
            f"PYSPARK_PYTHON={sys.executable} (this driver's Python) before creating the "
            f"SparkSession, or .config('spark.pyspark.python', {sys.executable!r})")


def _data_source() -> Any:
    """``source.NsqDataSource``, whose module imports pyspark (an optional extra): this
    package imports without it (``nsqx spark`` loads the jobs before a session exists)."""
    from nsqx.spark.source import NsqDataSource

    return NsqDataSource


def __getattr__(name: str) -> Any:
    if name == "NsqDataSource":
        return _data_source()
    raise AttributeError(name)
