"""nsqx on Apache Spark: the ``nsq`` PySpark data source and jobs built on it.

    from nsqx.spark import register
    register(spark)
    df = (spark.read.format("nsq").option("nsqd", "127.0.0.1:4151").option("topic", "events")
          .load())

See :mod:`nsqx.spark.source` for the options and the schema, :mod:`nsqx.spark.jobs` for the
``nsqx spark archive`` / ``nsqx spark stats`` jobs. ``pyspark`` and ``pyarrow`` come with the
``spark`` extra (``pip install 'nsqx[spark]'``); the package must be installed in the Python
that Spark's workers run (``PYSPARK_PYTHON``), as every Python data source must.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register", "NsqDataSource"]


def register(spark: Any) -> None:
    """Register the ``nsq`` data source on a SparkSession (registration is per session)."""
    from nsqx.spark.source import NsqDataSource

    spark.dataSource.register(NsqDataSource)


def __getattr__(name: str) -> Any:
    if name == "NsqDataSource":
        from nsqx.spark.source import NsqDataSource

        return NsqDataSource
    raise AttributeError(name)
