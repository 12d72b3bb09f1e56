"""nsqlookupd's options: upstream's flags, defaults and config file (``apps/nsqlookupd``).

Precedence is go-options': command line > ``--config`` TOML file > default.
Durations are float seconds.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import ClassVar

from nsqx.flags import (
    LOG_LEVELS,
    Flag,
    Program,
    basic_flags,
    cluster_flags,
    cluster_trust_flags,
    listen_flag,
    peer_flag,
)

__all__ = ["LOG_LEVELS", "Options", "OptionsError", "flag_set", "load", "parse_args",
           "version_string"]


class OptionsError(ValueError):
    """Options nsqlookupd refuses to start with."""


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
    # nsqx: the operators' endpoints ask nsqd's auth server (nsqx.httpauth.OPERATOR_RULES)
    auth_http_addresses: list[str] = field(default_factory=list)
    auth_http_request_method: str = "get"
    # its requests to the auth server: nsqd's default timeouts (no flags here, not fields)
    http_client_connect_timeout: ClassVar[float] = 2.0
    http_client_request_timeout: ClassVar[float] = 5.0

    def validate(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise OptionsError(
                f"invalid log level '{self.log_level}' (debug, info, warn, error, fatal)")
        if self.auth_http_request_method not in ("get", "post"):
            raise OptionsError("--auth-http-request-method must be post or get")


def _flags() -> list[Flag]:
    d = Options(broadcast_address="")
    return [
        *basic_flags(d.log_prefix),
        listen_flag("tcp-address", d.tcp_address, "<addr>:<port> to listen on for TCP clients"),
        listen_flag("http-address", d.http_address, "<addr>:<port> to listen on for HTTP clients"),
        Flag("broadcast-address", "string", "",
             "address of this lookupd node, (default to the OS hostname)",
             default_text=f'"{socket.gethostname()}"'),
        Flag("inactive-producer-timeout", "duration", d.inactive_producer_timeout,
             "duration of time a producer will remain in the active list since its last ping"),
        Flag("tombstone-lifetime", "duration", d.tombstone_lifetime,
             "duration of time a producer will remain tombstoned if registration remains"),
        *cluster_flags(d.cluster_id, "(comma separated or repeated); when set, this "
                       "nsqlookupd campaigns to be the cluster's coordinator and answers "
                       "/lookup from the cluster's metadata"),
        Flag("cluster-rebalance", "bool", d.cluster_rebalance, "[nsqx] while coordinating: "
             "give leadership back to preferred replicas and move replicas onto a node that "
             "holds clearly fewer than the average (one that joined), one partition at a time"),
        *cluster_trust_flags("the coordinator signs its calls to nodes with it"),
        peer_flag("auth-http-address", "[nsqx] <addr>:<port> or a full url of nsqd's auth "
                  "server: topic/channel changes and /trace/search then need a client secret "
                  "granting the permission (may be given multiple times)",
                  dest="auth_http_addresses"),
        Flag("auth-http-request-method", "string", d.auth_http_request_method,
             "[nsqx] HTTP method to use for auth server requests"),
    ]


# "" for --broadcast-address means the default: the hostname
PROGRAM = Program("nsqlookupd", Options, _flags, (OptionsError,),
                  empty_is_default=("broadcast_address",))


# the module's API (the entry point and the server use these names)
flag_set = PROGRAM.flag_set
version_string = PROGRAM.version
load = PROGRAM.load  # argv (+ --config) -> (validated Options, extras {help, version})
parse_args = PROGRAM.parse_args  # exits 0 after --help/--version, 2 on a bad flag
