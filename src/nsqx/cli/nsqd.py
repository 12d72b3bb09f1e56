"""`nsqd` entry point: parse upstream's flags, run a node until SIGTERM/SIGINT."""

from __future__ import annotations

import json
import logging
import os
import sys

from nsqx.cli import lazy
from nsqx.cli.daemon import Banner, cluster_mode, cluster_settings, run_daemon, setup_logging
from nsqx.nsqd.node import NSQD
from nsqx.nsqd.options import parse_args


def _addresses(node: NSQD) -> str:
    host = node.opts.tcp_address.rpartition(":")[0]
    out = [f"TCP {host}:{node.tcp_port}"]
    if node.opts.http_address:
        out.append(f"HTTP {node.opts.http_address.rpartition(':')[0]}:{node.http_port}")
    if node.https_port:
        out.append(f"HTTPS {node.opts.https_address.rpartition(':')[0]}:{node.https_port}")
    return ", ".join(out)


WORKER_ENV = "NSQX_WORKER"  # nsqx.nsqd.workers.supervisor.WORKER_ENV: this is a worker


def _worker_prefix(prefix: str, index: int) -> str:
    """``[nsqd] `` -> ``[nsqd w1] ``: every log line says which worker wrote it."""
    if prefix.endswith("] "):
        return f"{prefix[:-2]} w{index}] "
    return f"{prefix}w{index} "


def main(argv: list[str] | None = None) -> None:
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse_args(argv)
    spec = json.loads(os.environ.pop(WORKER_ENV, "") or "null")
    if spec is None and opts.workers > 1:
        # the supervisor: binds the listeners, runs the workers (nsqx.nsqd.workers)
        setup_logging(opts.log_level, opts.log_prefix)
        logging.getLogger("nsqx.nsqd").info(
            "%s; %d worker processes (--workers, experimental)",
            Banner("nsqd", cluster_mode(opts), opts.data_path or ".", _addresses).opening(),
            opts.workers)
        raise SystemExit(lazy.workers().Supervisor(opts, raw_argv).run())
    if spec is not None:
        opts.log_prefix = _worker_prefix(opts.log_prefix, int(spec["index"]))

    def make():  # type: ignore[no-untyped-def]
        node = NSQD(opts)
        if spec is not None:
            lazy.workers().attach(node, spec)
        if opts.cluster_leadership_addresses:
            try:  # a bad secret file or etcd endpoint option: a clear error, no start
                endpoints, secret, tls = cluster_settings(opts)
                node.plugins.append(lazy.node_member()(node, endpoints, opts.cluster_id,
                                               ttl=opts.cluster_node_ttl, secret=secret,
                                               cluster_address=opts.cluster_address, tls=tls))
            except ValueError as e:
                raise SystemExit(f"FATAL: {e}") from None
        return node

    run_daemon(opts, make, "nsqx.nsqd",
               Banner("nsqd", cluster_mode(opts), opts.data_path or ".", _addresses))


if __name__ == "__main__":
    main()
