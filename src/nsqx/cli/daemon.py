"""What every server entry point does: logging, uvloop, start, wait for SIGTERM/SIGINT, stop."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from nsqx import NSQ_VERSION, __version__, speedups
from nsqx.cli import lazy

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
          "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}


class Server(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def setup_logging(level: str, prefix: str) -> None:
    """Upstream's log shape: `<prefix><time> <LEVEL>: <message>` on stderr."""
    logging.basicConfig(
        level=LEVELS.get(str(level).lower(), logging.INFO),
        format=f"{prefix}%(asctime)s %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def build_kind() -> str:
    """Whether the C speedups (nsqx._speedups) run or their pure-Python twins."""
    if speedups.native is not None:
        return "compiled C speedups"
    if os.environ.get("NSQX_NO_SPEEDUPS"):
        return "interpreted (NSQX_NO_SPEEDUPS is set)"
    return "interpreted (C speedups not built)"


def cluster_mode(opts: Any) -> str:
    """The banner's mode of nsqd and nsqlookupd (their ``--cluster-leadership-address``)."""
    if not opts.cluster_leadership_addresses:
        return "standalone mode"
    return "cluster mode (etcd " + ",".join(opts.cluster_leadership_addresses) + ")"


def cluster_settings(opts: Any) -> tuple[list[str], bytes | None, Any]:
    """(etcd endpoints, secret, (server, client) TLS contexts or None) from the cluster
    options nsqd and nsqlookupd share; a bad secret or TLS file is a ValueError."""
    trust = lazy.cluster_trust()
    endpoints = [u for a in opts.cluster_leadership_addresses for u in a.split(",") if u]
    secret = trust.load_secret(opts.cluster_secret_file) if opts.cluster_secret_file else None
    tls = None
    if opts.cluster_tls_cert or opts.cluster_tls_key or opts.cluster_tls_ca:
        tls = trust.tls_contexts(opts.cluster_tls_cert, opts.cluster_tls_key, opts.cluster_tls_ca)
    return endpoints, secret, tls


@dataclass(frozen=True)
class Banner:
    """What a server says at start, so that whoever reads its log knows what runs: who,
    which build, which mode, where its data is; once listening, one ``ready`` line with
    its addresses (scripts and people can wait for it)."""

    program: str  # "nsqd"
    mode: str  # "standalone mode", "cluster mode (etcd ...)", "reading lookupd ..."
    data_path: str | None  # None: the program keeps no data
    addresses: Callable[[Any], str]  # the started server -> "TCP a, HTTP b"

    def opening(self) -> str:
        data = f", data path {os.path.abspath(self.data_path)}" if self.data_path is not None else ""
        return (f"{self.program} v{NSQ_VERSION} (nsqx {__version__}, {build_kind()}), "
                f"{self.mode}{data}")


async def serve(make: Callable[[], Server], logger: str, banner: Banner | None = None) -> None:
    """Start the server, run until SIGTERM/SIGINT, then stop it gracefully."""
    loop = asyncio.get_running_loop()
    log = logging.getLogger(logger)
    if banner is not None:
        log.info("%s", banner.opening())
    server = make()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except OSError as exc:
        log.critical("failed to start: %s", exc)
        await server.stop()
        raise SystemExit(1) from exc
    if banner is not None:
        log.info("ready: %s", banner.addresses(server))
    await stop.wait()
    await server.stop()


# glibc mallopt parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc(mmap_threshold: int = 16 << 20, trim_threshold: int = 8 << 20) -> bool:
    """Serve large buffers (reads, MPUB bodies, frame batches) from the heap, not mmap.

    Speed: glibc hands out blocks over 128 KiB (its starting threshold) with a fresh mmap,
    so every 200 KB batch paid ~50 page faults and the zeroing of new pages: building
    the frames of a 200 x 1 KB MPUB took 661 ns/msg, 239 with this. Up to
    trim_threshold of freed heap is kept for reuse (bounded RSS). False when the C
    library has no mallopt (not glibc): nothing changes then.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def raise_open_file_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit, as Go's runtime does for Go nsqd.

    Every log segment keeps its files open (six), every client one socket: a large
    backlog or many clients need more than the common soft limit of 1024.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            pass
    return soft


def run_daemon(opts: Any, make: Callable[[], Server], logger: str,
               banner: Banner | None = None) -> None:
    """Entry-point body: logging from the options, uvloop when available, serve."""
    setup_logging(opts.log_level, opts.log_prefix)
    tune_malloc()
    raise_open_file_limit()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(make, logger, banner))
