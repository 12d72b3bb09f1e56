"""Spark read benchmark of the ``nsq`` data source (prints rows/s; not a test).

    .venv/bin/python bench/spark_read.py [--records 1000000] [--size 100] [--partitions 4]
                                         [--master local[2]] [--nsqd HOST:PORT] [--runs 3]

Starts an nsqd on a temporary data directory (unless ``--nsqd`` is given), publishes
``--records`` bodies of ``--size`` bytes to a topic, then reads the whole topic with
``spark.read.format("nsq")`` into the ``noop`` sink (every column materialised), first cold
then ``--runs`` warm times, and prints rows/s. Also prints the decoder alone (fetch + Arrow,
one core, no Spark) for comparison. Spark splits the range into ``--partitions`` tasks.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from nsqx.spark.client import NodeClient, encode_pub_body  # noqa: E402


def start_nsqd(data: Path) -> tuple[subprocess.Popen, str]:
    log = open(data / "nsqd.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "nsqx.cli.nsqd", "--tcp-address=127.0.0.1:0",
                             "--http-address=127.0.0.1:0", f"--data-path={data}",
                             "--mem-queue-size=0"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(rb"HTTP: listening on (\S+):(\d+)", (data / "nsqd.log").read_bytes())
        if m:
            return proc, f"127.0.0.1:{int(m.group(2))}"
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("nsqd did not start:\n" + (data / "nsqd.log").read_text())


def fill(addr: str, topic: str, records: int, size: int) -> None:
    c = NodeClient(addr, timeout=120)
    have = c.offsets(topic)[0]["latest"] if _exists(c, topic) else 0
    per = max(1, (4 << 20) // (size + 8))
    body = b"x" * size
    t = time.perf_counter()
    i = have
    while i < records:
        n = min(per, records - i)
        c.request("POST", "/mpub", {"topic": topic, "binary": "true"},
                  encode_pub_body([body] * n))
        i += n
    print(f"published {records - have} x {size} B in {time.perf_counter() - t:.1f}s")


def _exists(c: NodeClient, topic: str) -> bool:
    try:
        c.offsets(topic)
        return True
    except Exception:
        return False


def decoder_only(addr: str, topic: str, records: int) -> float:
    from nsqx.spark.source import NsqDataSource

    ds = NsqDataSource({"nsqd": addr, "topic": topic})
    r = ds.reader(ds.schema())
    t = time.perf_counter()
    n = 0
    for p in r.partitions():
        for rb in r.read(p):
            n += rb.num_rows
    dt = time.perf_counter() - t
    assert n == records, n
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--nsqd")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nsqx-bench-"))
    proc = None
    try:
        if args.nsqd:
            addr = args.nsqd
        else:
            proc, addr = start_nsqd(tmp)
        topic = f"bench_{args.size}"
        fill(addr, topic, args.records, args.size)
        print(f"decoder alone (fetch + Arrow, 1 core, no Spark): "
              f"{decoder_only(addr, topic, args.records) / 1e6:.2f} M rows/s")
        from pyspark.sql import SparkSession

        from nsqx.spark import register

        spark = (SparkSession.builder.master(args.master).appName("nsqx-bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.adaptive.enabled", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)

        def run() -> float:
            df = (spark.read.format("nsq").option("nsqd", addr).option("topic", topic)
                  .option("endingOffsets", f'{{"0": {args.records}}}')
                  .option("minPartitions", str(args.partitions)).load())
            t = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - t

        cold = run()
        print(f"spark {args.master}, noop sink, {args.records} x {args.size} B: "
              f"cold {args.records / cold / 1e6:.2f} M rows/s ({cold:.1f}s)")
        best = 0.0
        for i in range(args.runs):
            dt = run()
            rate = args.records / dt
            best = max(best, rate)
            print(f"  warm run {i + 1}: {rate / 1e6:.2f} M rows/s ({dt:.2f}s)")
        print(f"best warm: {best / 1e6:.2f} M rows/s")
        df = (spark.read.format("nsq").option("nsqd", addr).option("topic", topic)
              .option("endingOffsets", f'{{"0": {args.records}}}')
              .option("minPartitions", str(args.partitions)).load())
        t = time.perf_counter()
        row = df.selectExpr("count(*) AS n", "sum(length(body)) AS b",
                            "max(offset) AS o").collect()[0]
        dt = time.perf_counter() - t
        assert (row.n, row.b, row.o) == (args.records, args.records * args.size,
                                         args.records - 1), row
        print(f"count + sum(length(body)) + max(offset) (checked): "
              f"{args.records / dt / 1e6:.2f} M rows/s ({dt:.2f}s)")
        spark.stop()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
