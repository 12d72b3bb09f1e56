"""The Parquet codecs an archive may be written with (``nsqd --archive-compression``).

A module of its own so that nsqd's flag table names them without importing the archive
code, which loads only when archiving is asked for (start time).
"""

from __future__ import annotations

__all__ = ["CODECS"]

# Parquet records the codec in every column chunk. pyarrow's "lz4" writes Parquet's LZ4_RAW
# (read by parquet-mr 1.13+, i.e. Spark 3.5+, and DuckDB), never the deprecated
# Hadoop-framed LZ4; gzip at zlib's default level 6 (Kafka's), zstd at level 1 (the fastest).
CODECS: dict[str, tuple[str, int | None]] = {
    "zstd": ("zstd", 1), "lz4": ("lz4", None), "snappy": ("snappy", None),
    "gzip": ("gzip", 6), "none": ("none", None)}
