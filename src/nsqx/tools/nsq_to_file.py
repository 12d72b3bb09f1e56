"""``nsq_to_file``: write the messages of topics to rotated files, one line per message
(upstream ``apps/nsq_to_file``).

* One consumer and one file per topic: ``--topic`` (repeatable), or every topic lookupd knows
  matching ``--topic-pattern`` (a regular expression, searched), re-read from lookupd's
  ``/topics`` every ``--topic-refresh``.
* File names: ``--filename-format`` with ``<TOPIC>``, ``<HOST>`` (``--host-identifier``,
  which may use ``<SHORT_HOST>``/``<HOSTNAME>``), ``<PID>``, ``<DATETIME>``
  (``--datetime-format``, strftime) and ``<REV>`` (``-000000``, bumped when a file exists;
  required with ``--gzip``, rotation or ``--work-dir``). ``--gzip`` adds ``.gz``.
* Rotation: when ``<DATETIME>`` changes, after ``--rotate-interval``, or when the file grew
  past ``--rotate-size`` bytes (uncompressed bytes written). SIGHUP rotates too.
* Files are written in ``--work-dir`` and, once closed (fsynced), moved to ``--output-dir``
  with an exclusive rename (link + unlink; never overwriting), so the output directory only
  ever holds complete files. Without ``--work-dir`` files are written in place.
* A message is FINished only after it was written and fsynced: every ``--sync-interval``,
  when ``--max-in-flight`` messages wait, or when nsqd would otherwise stop sending. With
  ``--gzip`` each sync ends a gzip member (the file is a valid concatenation of members).
* SIGINT/SIGTERM: stop consuming, sync and FIN what was written, requeue the rest, close
  (and move) the files, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import gzip
import logging
import os
import re
import shutil
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any, BinaryIO

import aiohttp
import orjson

from nsqx.client import Consumer, Message
from nsqx.flags import Flag
from nsqx.protocol.names import valid_channel_name, valid_topic_name

from . import common
from .consuming import ConsumingTool, run_consuming

PROG = "nsq_to_file"
log = logging.getLogger("nsqx.tools.nsq_to_file")


def flags() -> list[Flag]:
    return [
        common.version_flag(),
        Flag("log-level", "string", "info", "set log verbosity: debug, info, warn, error, or fatal"),
        Flag("log-prefix", "string", "[nsq_to_file] ", "log message prefix"),
        Flag("channel", "string", "nsq_to_file", "nsq channel"),
        Flag("max-in-flight", "int", 200, "max number of messages to allow in flight"),
        Flag("output-dir", "string", "/tmp", "directory to write output files to"),
        Flag("work-dir", "string", "",
             "directory for in-progress files before moving to output-dir"),
        Flag("datetime-format", "string", "%Y-%m-%d_%H",
             "strftime compatible format for <DATETIME> in filename format"),
        Flag("filename-format", "string", "<TOPIC>.<HOST><REV>.<DATETIME>.log",
             "output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced. "
             "<REV> is increased when file already exists)"),
        Flag("host-identifier", "string", "",
             "value to output in log filename in place of hostname. <SHORT_HOST> and "
             "<HOSTNAME> are valid replacement tokens"),
        Flag("gzip-level", "int", 6,
             "gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)"),
        Flag("gzip", "bool", False, "gzip output files."),
        Flag("skip-empty-files", "bool", False, "skip writing empty files"),
        Flag("topic-refresh", "duration", 60.0,
             "how frequently the topic list should be refreshed"),
        Flag("topic-pattern", "string", "", "only log topics matching the following pattern"),
        Flag("rotate-size", "int", 0,
             "rotate the file when it grows bigger than `rotate-size` bytes"),
        Flag("rotate-interval", "duration", 0.0, "rotate the file every duration"),
        Flag("sync-interval", "duration", 30.0, "sync file to disk every duration"),
        *common.http_client_flags(2.0, 5.0),
        *common.address_flags(),
        Flag("topic", "strings", [], "nsq topic (may be given multiple times)"),
        common.consumer_opt_flag(),
        common.stats_interval_flag(10.0),
    ]


def compute_filename_format(opts: common.Options, topic: str) -> str:
    hostname = socket.gethostname()
    short = hostname.split(".")[0]
    identifier = short
    if opts.host_identifier:
        identifier = opts.host_identifier.replace("<SHORT_HOST>", short)
        identifier = identifier.replace("<HOSTNAME>", hostname)
    cff = opts.filename_format
    if opts.gzip or opts.rotate_size > 0 or opts.rotate_interval > 0 \
            or opts.work_dir != opts.output_dir:
        if "<REV>" not in cff:
            raise common.Fatal("missing <REV> in --filename-format when gzip, rotation, or work "
                               "dir enabled")
    else:
        cff = cff.replace("<REV>", "")  # not needed
    cff = cff.replace("<TOPIC>", topic).replace("<HOST>", identifier)
    cff = cff.replace("<PID>", str(os.getpid()))
    if opts.gzip and not cff.endswith(".gz"):
        cff += ".gz"
    return cff


def exclusive_rename(src: str, dst: str) -> None:
    """Move without ever overwriting (FileExistsError if ``dst`` exists); atomic on one
    filesystem. Across filesystems the data is copied to a hidden temporary file next to
    ``dst`` first, so ``dst`` appears complete or not at all."""
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        d, base = os.path.split(dst)
        tmp = os.path.join(d, f".{base}.{os.getpid()}.tmp")
        shutil.copyfile(src, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        try:
            os.link(tmp, dst)
        finally:
            os.unlink(tmp)
    os.unlink(src)


class _Item:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


TERM, HUP, CLOSED = _Item("TERM"), _Item("HUP"), _Item("CLOSED")


class FileLogger:
    """One topic: a consumer whose messages a router task writes, syncs, FINs and rotates."""

    def __init__(self, opts: common.Options, topic: str, consumer_kwargs: dict[str, Any],
                 reporter: common.RateReporter) -> None:
        self.opts = opts
        self.topic = topic
        self.reporter = reporter
        self.filename_format = compute_filename_format(opts, topic)
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.consumer = Consumer(
            topic, opts.channel, self._handle,
            nsqd_tcp_addresses=opts.nsqd_tcp_address,
            lookupd_http_addresses=opts.lookupd_http_address,
            max_in_flight=opts.max_in_flight, **consumer_kwargs)
        self.out: BinaryIO | None = None
        self.gz: gzip.GzipFile | None = None
        self.path = ""
        self.filename: str | None = None
        self.open_time = 0.0
        self.filesize = 0
        self.rev = 0
        self.pending: list[Message] = []
        self.task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self.ident = f"[{topic}/{opts.channel}]"

    # -- consumer side --------------------------------------------------------------------
    def _handle(self, msg: Message) -> None:
        msg.disable_auto_response()
        self.queue.put_nowait(msg)

    async def start(self) -> None:
        await self.consumer.start()
        self.task = asyncio.get_running_loop().create_task(self.router())

    def term(self) -> None:
        self.queue.put_nowait(TERM)

    def hup(self) -> None:
        self.queue.put_nowait(HUP)

    def _starved(self) -> bool:
        """nsqd will not send more until we answer (go-nsq's IsStarved)."""
        for c in self.consumer.connections:
            if c.in_flight > 0 and c.in_flight >= c.rdy * 0.85:
                return True
        return False

    # -- router ---------------------------------------------------------------------------
    async def router(self) -> None:
        opts = self.opts
        interval = opts.sync_interval
        next_tick = time.monotonic() + interval
        stopping = False
        while True:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    async with asyncio.timeout(max(0.0, next_tick - time.monotonic())):
                        item = await self.queue.get()
                except TimeoutError:
                    item = None
            sync = close_file = exit_ = False
            if item is None:  # sync tick
                next_tick = time.monotonic() + interval
                if self.needs_rotation():
                    if opts.skip_empty_files:
                        close_file = True
                    else:
                        await self.update_file()
                sync = True
            elif item is TERM:
                if not stopping:
                    stopping = True
                    self._close_task = asyncio.get_running_loop().create_task(self._close())
                sync = True
            elif item is HUP:
                sync = close_file = True
            elif item is CLOSED:
                sync = close_file = exit_ = True
            else:
                msg: Message = item
                if msg.has_responded:  # requeued by the consumer while closing
                    continue
                if self.needs_rotation():
                    await self.update_file()
                    sync = True
                self.write(msg.body + b"\n")
                self.pending.append(msg)
                if len(self.pending) >= max(1, opts.max_in_flight):
                    sync = True
            # nsqd sends no more until we answer: once every message received is written,
            # sync (one fsync per batch, not per message)
            if self.pending and (sync or (self.queue.empty() and (stopping or self._starved()))):
                log.info("%s syncing %d records to disk", self.ident, len(self.pending))
                await self.sync()
                n = len(self.pending)
                for m in self.pending:
                    m.finish()
                self.pending.clear()
                self.reporter.add(n)
            if close_file:
                await self.close()
            if exit_:
                return

    async def _close(self) -> None:
        try:
            await self.consumer.close()
        finally:
            self.queue.put_nowait(CLOSED)

    # -- files ----------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        assert self.out is not None
        try:
            if self.gz is not None:
                self.gz.write(data)
            else:
                self.out.write(data)
        except OSError as e:
            log.critical("%s writing message to disk: %s", self.ident, e)
            os._exit(1)
        self.filesize += len(data)

    async def sync(self) -> None:
        out = self.out
        if out is None:
            return
        try:
            if self.gz is not None:
                # end this gzip member: its trailer (CRC) vouches for what was acknowledged
                self.gz.close()
                out.flush()
                await asyncio.to_thread(os.fsync, out.fileno())
                self.gz = self._new_gzip(out)
            else:
                out.flush()
                await asyncio.to_thread(os.fsync, out.fileno())
        except OSError as e:
            log.critical("%s failed syncing messages: %s", self.ident, e)
            os._exit(1)

    def _new_gzip(self, out: BinaryIO) -> gzip.GzipFile:
        return gzip.GzipFile(filename="", mode="wb", compresslevel=self.opts.gzip_level,
                             fileobj=out)

    def current_filename(self) -> str:
        dt = datetime.datetime.now().strftime(self.opts.datetime_format)
        return self.filename_format.replace("<DATETIME>", dt)

    def needs_rotation(self) -> bool:
        if self.out is None:
            return True
        filename = self.current_filename()
        if filename != self.filename:
            log.info("%s new filename %s, rotating...", self.ident, filename)
            return True
        ri = self.opts.rotate_interval
        if ri > 0 and time.monotonic() - self.open_time > ri:
            log.info("%s %.1fs since last open, rotating...", self.ident,
                     time.monotonic() - self.open_time)
            return True
        rs = self.opts.rotate_size
        if rs > 0 and self.filesize > rs:
            log.info("%s %s currently %d bytes (> %d), rotating...", self.ident, self.path,
                     self.filesize, rs)
            return True
        return False

    def _output_name(self, work_path: str) -> str:
        rel = os.path.relpath(work_path, self.opts.work_dir)
        return os.path.join(self.opts.output_dir, rel)

    async def update_file(self) -> None:
        await self.close()
        opts = self.opts
        filename = self.current_filename()
        if filename != self.filename:
            self.rev = 0
        else:
            self.rev += 1
        self.filename = filename
        self.open_time = time.monotonic()
        full = os.path.join(opts.work_dir, filename)
        try:
            os.makedirs(os.path.dirname(full) or ".", mode=0o770, exist_ok=True)
            while True:
                path = full.replace("<REV>", f"-{self.rev:06d}")
                if opts.work_dir != opts.output_dir:
                    # avoid a name already taken in the output dir
                    out_name = self._output_name(path)
                    os.makedirs(os.path.dirname(out_name) or ".", mode=0o770, exist_ok=True)
                    if os.path.lexists(out_name):
                        log.warning("%s output file already exists: %s", self.ident, out_name)
                        self.rev += 1
                        continue
                flags = os.O_WRONLY | os.O_CREAT
                if opts.gzip or opts.rotate_interval > 0:
                    flags |= os.O_EXCL
                else:
                    flags |= os.O_APPEND
                try:
                    fd = os.open(path, flags, 0o666)
                except FileExistsError:
                    log.warning("%s working file already exists: %s", self.ident, path)
                    self.rev += 1
                    continue
                out = open(fd, "wb", buffering=256 * 1024)  # noqa: SIM115
                log.info("%s opening %s", self.ident, path)
                self.filesize = os.fstat(fd).st_size
                if opts.rotate_size > 0 and self.filesize > opts.rotate_size:
                    log.info("%s %s currently %d bytes (> %d), rotating...", self.ident, path,
                             self.filesize, opts.rotate_size)
                    out.close()
                    self.rev += 1
                    continue
                break
        except OSError as e:
            log.critical("%s unable to open output file: %s", self.ident, e)
            os._exit(1)
        self.out = out
        self.path = path
        self.gz = self._new_gzip(out) if opts.gzip else None

    async def close(self) -> None:
        out = self.out
        if out is None:
            return
        opts = self.opts
        try:
            if self.gz is not None:
                self.gz.close()
                self.gz = None
            out.flush()
            await asyncio.to_thread(os.fsync, out.fileno())
            out.close()
        except OSError as e:
            log.critical("%s failed to close output file: %s", self.ident, e)
            os._exit(1)
        self.out = None
        if opts.work_dir == opts.output_dir:
            return
        src = self.path
        dst = self._output_name(src)
        log.info("%s moving finished file %s to %s", self.ident, src, dst)
        try:
            try:
                await asyncio.to_thread(exclusive_rename, src, dst)
                return
            except FileExistsError:
                pass
            # taken meanwhile: bump the revision until a name is free
            assert self.filename is not None
            tmpl = self._output_name(os.path.join(opts.work_dir, self.filename))
            i = self.rev + 1
            while True:
                log.warning("%s destination file already exists: %s", self.ident, dst)
                dst = tmpl.replace("<REV>", f"-{i:06d}")
                try:
                    await asyncio.to_thread(exclusive_rename, src, dst)
                except FileExistsError:
                    i += 1
                    continue
                log.info("%s renamed finished file %s to %s to avoid overwrite", self.ident,
                         src, dst)
                return
        except OSError as e:
            log.critical("%s unable to move file from %s to %s: %s", self.ident, src, dst, e)
            os._exit(1)


async def lookupd_topics(session: aiohttp.ClientSession, addresses: Sequence[str],
                         opts: common.Options) -> list[str]:
    """Every topic any lookupd knows (``GET /topics``); raises if none answered."""
    timeout = aiohttp.ClientTimeout(total=opts.http_client_request_timeout,
                                    connect=opts.http_client_connect_timeout)

    async def one(addr: str) -> list[str]:
        base = addr if "://" in addr else "http://" + addr
        async with session.get(base.rstrip("/") + "/topics", timeout=timeout,
                               headers={"Accept": "application/vnd.nsq; version=1.0"}) as r:
            body = await r.read()
            if r.status != 200:
                raise RuntimeError(f"{addr}: HTTP {r.status}")
        data = orjson.loads(body)
        if isinstance(data, dict) and "topics" not in data and isinstance(data.get("data"), dict):
            data = data["data"]
        return list(data.get("topics") or [])

    results = await asyncio.gather(*(one(a) for a in addresses), return_exceptions=True)
    topics: set[str] = set()
    errors = []
    for addr, res in zip(addresses, results, strict=True):
        if isinstance(res, BaseException):
            errors.append(f"{addr}: {res!r}")
        else:
            topics.update(res)
    if len(errors) == len(addresses):
        raise RuntimeError("failed to query any nsqlookupd: " + "; ".join(errors))
    for e in errors:
        log.error("could not retrieve topic list: %s", e)
    return sorted(topics)


class ToFile(ConsumingTool):
    """One :class:`FileLogger` (its own consumer) per topic: the ``--topic`` ones, or those
    lookupd lists matching ``--topic-pattern``, re-read every ``--topic-refresh``."""

    prog = PROG

    def setup_logging(self) -> None:
        opts = self.opts
        if opts.log_level.lower() not in ("debug", "info", "warn", "warning", "error", "fatal"):
            raise common.Fatal("--log-level is invalid")
        common.setup_logging(opts.log_level, opts.log_prefix)

    def check(self) -> None:
        opts = self.opts
        if not opts.channel:
            raise common.Fatal("--channel is required")
        if not valid_channel_name(opts.channel):
            raise common.Fatal(f"--channel {opts.channel!r} is invalid")
        if opts.http_client_connect_timeout <= 0:
            raise common.Fatal("--http-client-connect-timeout should be positive")
        if opts.http_client_request_timeout <= 0:
            raise common.Fatal("--http-client-request-timeout should be positive")
        if not opts.nsqd_tcp_address and not opts.lookupd_http_address:
            raise common.Fatal("--nsqd-tcp-address or --lookupd-http-address required.")
        if opts.nsqd_tcp_address and opts.lookupd_http_address:
            raise common.Fatal("use --nsqd-tcp-address or --lookupd-http-address not both")
        if not 1 <= opts.gzip_level <= 9:
            raise common.Fatal(f"invalid --gzip-level value ({opts.gzip_level}), should be 1-9")
        if not opts.topic and not opts.topic_pattern:
            raise common.Fatal("--topic or --topic-pattern required")
        if not opts.topic and not opts.lookupd_http_address:
            raise common.Fatal("--lookupd-http-address must be specified when no --topic "
                               "specified")
        for t in opts.topic:
            if not valid_topic_name(t):
                raise common.Fatal(f"--topic {t!r} is invalid")
        if opts.max_in_flight < 1:
            raise common.Fatal("--max-in-flight must be positive")
        if opts.sync_interval <= 0:
            raise common.Fatal("--sync-interval should be positive")
        if opts.topic_refresh <= 0:
            raise common.Fatal("--topic-refresh should be positive")
        self.pattern = None
        if opts.topic_pattern:
            try:
                self.pattern = re.compile(opts.topic_pattern)
            except re.error as e:
                raise common.Fatal(f"--topic-pattern is invalid: {e}") from None
        if not opts.work_dir:
            opts.work_dir = opts.output_dir
        compute_filename_format(opts, "topic")  # fail fast on a bad format

    def progress(self) -> str:
        return f"{len(self.loggers)} topics"

    async def open(self) -> None:
        self.loggers: dict[str, FileLogger] = {}
        self.session: aiohttp.ClientSession | None = None
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.on_hup)

    def on_hup(self) -> None:
        for fl in self.loggers.values():
            fl.hup()

    async def update_topics(self, topics: Sequence[str]) -> None:
        opts, loggers = self.opts, self.loggers
        for topic in topics:
            if topic in loggers or self.stop.is_set():
                continue
            if self.pattern is not None and not self.pattern.search(topic):
                log.warning("skipping topic %s (doesn't match pattern %s)", topic,
                            opts.topic_pattern)
                continue
            if not valid_topic_name(topic):
                continue
            try:
                fl = FileLogger(opts, topic, self.consumer_kwargs, self.reporter)
                await fl.start()
            except common.Fatal:
                raise
            except Exception as e:
                log.error("couldn't create logger for new topic %s: %s", topic, e)
                continue
            loggers[topic] = fl

    async def consume(self) -> None:
        opts, stop = self.opts, self.stop
        self.reporter.start()
        await self.update_topics(opts.topic)
        if opts.topic:
            await stop.wait()
            return
        self.session = aiohttp.ClientSession()
        while not stop.is_set():
            try:
                await self.update_topics(
                    await lookupd_topics(self.session, opts.lookupd_http_address, opts))
            except Exception as e:
                log.error("could not retrieve topic list: %s", e)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(opts.topic_refresh):
                    await stop.wait()

    async def close(self) -> None:
        for fl in self.loggers.values():
            fl.term()
        tasks = [fl.task for fl in self.loggers.values() if fl.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()
        await self.reporter.close()


async def run(argv: Sequence[str] | None) -> int:
    return await run_consuming(ToFile, flags(), argv, __doc__ or "")


main = common.tool_main(PROG, run)


if __name__ == "__main__":
    main()
