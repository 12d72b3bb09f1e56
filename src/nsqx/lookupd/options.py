"""nsqlookupd's options: upstream's flags, defaults and config file (``apps/nsqlookupd``).

Precedence is go-options': command line > ``--config`` TOML file > default.
Durations are float seconds.
"""

from __future__ import annotations

import platform
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nsqx import NSQ_VERSION, __version__
from nsqx.cli.flags import Flag, FlagError, FlagSet, command_line_values, parse_or_exit

__all__ = ["LOG_LEVELS", "Options", "OptionsError", "flag_set", "load", "parse_args",
           "version_string"]

LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}


class OptionsError(ValueError):
    """Options nsqlookupd refuses to start with."""


def version_string() -> str:
    return f"nsqlookupd v{NSQ_VERSION} (built w/python{platform.python_version()}) nsqx/{__version__}"


@dataclass
class Options:
    log_level: str = "info"
    log_prefix: str = "[nsqlookupd] "
    tcp_address: str = "0.0.0.0:4160"
    http_address: str = "0.0.0.0:4161"
    broadcast_address: str = field(default_factory=socket.gethostname)
    inactive_producer_timeout: float = 300.0
    tombstone_lifetime: float = 45.0
    # cluster mode (Youzan's names): this lookupd campaigns to coordinate the cluster
    cluster_id: str = "nsqx"
    cluster_leadership_addresses: list[str] = field(default_factory=list)
    cluster_rebalance: bool = True
    cluster_secret_file: str = ""  # shared secret signing the coordinator's calls to nsqd
    cluster_tls_cert: str = ""  # mutual TLS to the nodes' cluster listeners: certificate,
    cluster_tls_key: str = ""  # key,
    cluster_tls_ca: str = ""  # and the members' CA

    def validate(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise OptionsError(
                f"invalid log level '{self.log_level}' (debug, info, warn, error, fatal)")


def _parse_log_level(s: str) -> str:
    s = s.lower()
    if s not in LOG_LEVELS:
        raise FlagError(f"invalid log level '{s}' (debug, info, warn, error, fatal)")
    return s


def _flags() -> list[Flag]:
    d = Options(broadcast_address="")
    return [
        Flag("config", "string", "", "path to config file"),
        Flag("version", "bool", False, "print version string"),
        Flag("log-level", "custom", "info", "set log verbosity: debug, info, warn, error, or fatal",
             parse=_parse_log_level, default_text="info"),
        Flag("log-prefix", "string", d.log_prefix, "log message prefix"),
        Flag("verbose", "bool", False, "[deprecated] has no effect, use --log-level",
             deprecated=True),
        Flag("tcp-address", "string", d.tcp_address, "<addr>:<port> to listen on for TCP clients"),
        Flag("http-address", "string", d.http_address,
             "<addr>:<port> to listen on for HTTP clients"),
        Flag("broadcast-address", "string", "",
             "address of this lookupd node, (default to the OS hostname)",
             default_text=f'"{socket.gethostname()}"'),
        Flag("inactive-producer-timeout", "duration", d.inactive_producer_timeout,
             "duration of time a producer will remain in the active list since its last ping"),
        Flag("tombstone-lifetime", "duration", d.tombstone_lifetime,
             "duration of time a producer will remain tombstoned if registration remains"),
        Flag("cluster-id", "string", d.cluster_id, "[nsqx] cluster name: the etcd key prefix "
             "/nsqx/<id>/ shared by the nsqd and nsqlookupd of one cluster"),
        Flag("cluster-leadership-addresses", "strings", [], "[nsqx] etcd client URLs "
             "(comma separated or repeated); when set, this nsqlookupd campaigns to be the "
             "cluster's coordinator and answers /lookup from the cluster's metadata",
             dest="cluster_leadership_addresses"),
        Flag("cluster-rebalance", "bool", d.cluster_rebalance, "[nsqx] while coordinating: "
             "give leadership back to preferred replicas and move replicas onto a node that "
             "holds clearly fewer than the average (one that joined), one partition at a time"),
        Flag("cluster-secret-file", "string", "", "[nsqx] file holding the cluster's shared "
             "secret (the nsqd's --cluster-secret-file): the coordinator signs its calls to nodes"),
        Flag("cluster-tls-cert", "string", "", "[nsqx] mutual TLS to the nodes' cluster "
             "listeners (with -key, -ca; the nsqd's --cluster-tls-*): this lookupd's certificate"),
        Flag("cluster-tls-key", "string", "", "[nsqx] key of --cluster-tls-cert"),
        Flag("cluster-tls-ca", "string", "", "[nsqx] CA of the members' certificates"),
    ]


_NON_OPTION_FLAGS = {"config", "version", "verbose"}


def flag_set() -> FlagSet:
    return FlagSet("nsqlookupd", _flags())


_CFG_INDEX: dict[str, Flag] = {f.cfg: f for f in _flags() if f.name not in _NON_OPTION_FLAGS}




def load(argv: Sequence[str]) -> tuple[Options, dict[str, Any]]:
    """argv (+ ``--config``) -> (validated Options, extras {help, version})."""
    values, extras = command_line_values("nsqlookupd", flag_set(), _CFG_INDEX, argv, ("verbose",))
    if extras["help"] or extras["version"]:
        return Options(), extras
    if values.get("broadcast_address") == "":
        del values["broadcast_address"]  # "" means the default: the hostname
    opts = Options(**values)
    opts.validate()
    return opts, extras



def parse_args(argv: Sequence[str] | None = None) -> Options:
    """The nsqlookupd command line -> Options (exits 0 after --help/--version, 2 on a bad flag)."""
    return parse_or_exit("nsqlookupd", argv, load, lambda: flag_set().usage(), version_string,
                         (OptionsError,))
