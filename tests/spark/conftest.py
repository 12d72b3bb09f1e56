"""Spark tests: ONE SparkSession for the whole run (starting one costs ~10 s, the first query
~8 s more), shared by every test that asks for the ``spark`` fixture. Tests that need it are
marked ``spark`` and ``slow``; the pure-Python tests of the data source (decoder, options,
offset math, the driver-side calls of the stream reader against a real nsqd) run without a JVM.

Workers import ``nsqx`` from the venv (``pip install -e .``), so PYSPARK_PYTHON is the test
interpreter.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("pyspark")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        if os.environ.get("CI"):
            pytest.fail("Spark tests need Java 17 (java on PATH or JAVA_HOME)")
        pytest.skip("no Java: Spark tests need Java 17")
    from pyspark.sql import SparkSession

    from nsqx.spark import register

    warehouse = tmp_path_factory.mktemp("warehouse")
    session = (
        SparkSession.builder.master("local[2]").appName("nsqx-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.warehouse.dir", str(warehouse))
        # C1-only JIT + serial GC: faster start-up and lower RSS for short test jobs
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={warehouse} "
                + os.environ.get("SPARK_TEST_JVM_OPTS",
                                 "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"))
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()
