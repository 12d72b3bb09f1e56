"""nsqd's options: every upstream flag, upstream defaults, upstream config file.

Field names are upstream's ``cfg`` names (flag with ``-`` -> ``_``, or the
explicit cfg tag such as ``nsqlookupd_tcp_addresses``), except ``node_id``
whose upstream cfg name is ``id`` (accepted in TOML and by ``/config/id``).
Durations are float seconds; ``Options.go_value`` gives the value the way Go's
``/config/:opt`` JSON shows it (durations in nanoseconds, enums as numbers).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import socket
import ssl
import zlib
from dataclasses import dataclass, field, fields
from typing import Any

from nsqx.extras import install_command
from nsqx.flags import (
    LOG_LEVELS,
    Flag,
    FlagError,
    Program,
    basic_flags,
    choice_flag,
    cluster_flags,
    cluster_trust_flags,
    http_client_flags,
    listen_flag,
    parse_go_bool,
    peer_flag,
)
from nsqx.storage.archive_codecs import CODECS as ARCHIVE_CODECS
from nsqx.storage.archive_url import parse_url as parse_archive_url

__all__ = [
    "LOG_LEVELS",
    "TLS_NOT_REQUIRED",
    "TLS_REQUIRED",
    "TLS_REQUIRED_EXCEPT_HTTP",
    "Options",
    "OptionsError",
    "flag_set",
    "load",
    "parse_args",
    "version_string",
]

# tls_required values (upstream's iota order: they are what /config/tls_required shows)
TLS_NOT_REQUIRED = 0
TLS_REQUIRED_EXCEPT_HTTP = 1
TLS_REQUIRED = 2

# tls_min_version names -> Go's uint16 constants
TLS_VERSIONS = {"tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}
_SSL_VERSIONS = {
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}

EXPERIMENTS = ("topology-aware-consumption",)


class OptionsError(ValueError):
    """Options that upstream nsqd would refuse to start with."""


def _default_node_id() -> int:
    # upstream: crc32(md5(hostname)) % 1024
    digest = hashlib.md5(socket.gethostname().encode()).digest()
    return zlib.crc32(digest) % 1024


@dataclass
class Options:
    # basic options
    node_id: int = field(default_factory=_default_node_id)
    log_level: str = "info"
    log_prefix: str = "[nsqd] "
    # nsqx: worker processes behind the node's ports (1: one process, as always;
    # nsqx.nsqd.workers); --workers=auto is the usable cores
    workers: int = 1

    tcp_address: str = "0.0.0.0:4150"
    http_address: str = "0.0.0.0:4151"
    https_address: str = "0.0.0.0:4152"
    broadcast_address: str = field(default_factory=socket.gethostname)
    broadcast_tcp_port: int = 0
    broadcast_http_port: int = 0
    nsqlookupd_tcp_addresses: list[str] = field(default_factory=list)
    auth_http_addresses: list[str] = field(default_factory=list)
    auth_http_request_method: str = "get"
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    topology_region: str = ""
    topology_zone: str = ""
    # cluster mode (Youzan's names): on exactly when leadership addresses are given
    cluster_id: str = "nsqx"
    cluster_leadership_addresses: list[str] = field(default_factory=list)
    cluster_node_ttl: float = 3.0  # seconds an nsqd stays a live member without refreshing
    cluster_secret_file: str = ""  # shared secret signing requests between members
    cluster_address: str = ""  # internal listener for other members ("": HTTP host, OS port)
    broadcast_cluster_port: int = 0  # the cluster listener's port as registered in etcd
    cluster_tls_cert: str = ""  # mutual TLS between members: this node's certificate,
    cluster_tls_key: str = ""  # its key,
    cluster_tls_ca: str = ""  # and the CA every member's certificate chains to
    cluster_replication: str = "stream"  # followers fetch over one stream per leader, or HTTP

    # storage (upstream "diskqueue options", same names and meanings)
    data_path: str = field(default_factory=os.getcwd)
    mem_queue_size: int = 10000
    max_bytes_per_file: int = 104857600
    sync_every: int = 2500  # fsync after this many messages
    sync_timeout: float = 2.0  # fsync at least this often when dirty
    # nsqx: how long/much of the log to keep after every channel consumed it (replay)
    retention_time: float = 0.0
    retention_bytes: int = 0
    max_log_bytes: int = 0  # hard cap per topic: lagging channels skip what it drops
    mem_tail_budget: int = 32 * 1024 * 1024  # newest messages kept in memory, all topics together
    # nsqx tiered storage (docs/archive.md): closed segments archived as Parquet
    archive_url: str = ""  # a directory or s3://bucket/prefix ("" = off)
    archive_s3_endpoint: str = ""  # host:port or URL of the S3 service (default: AWS)
    archive_compression: str = "zstd"  # Parquet codec of archived files (storage.archive_codecs)

    queue_scan_interval: float = 0.1  # no flag upstream
    queue_scan_refresh_interval: float = 5.0  # no flag upstream
    queue_scan_selection_count: int = 20
    queue_scan_worker_pool_max: int = 4
    queue_scan_dirty_percent: float = 0.25  # no flag upstream

    # msg and command options
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_msg_size: int = 1048576
    max_body_size: int = 5242880
    max_req_timeout: float = 3600.0
    max_delay: float = 0.0  # nsqx: ceiling of DPUB/REQ delays (0: --max-req-timeout's)
    max_attempts: int = 0  # nsqx: deliveries before a message goes to <topic>.dlq (0: never)
    msg_ttl: float = 0.0  # nsqx: messages older than this are skipped at delivery (0: kept)
    # nsqx: idempotent publishes (Idempotency-Key, idempotent producers): how long and how
    # many keys / producer ids each partition remembers
    idempotency_window: float = 86400.0
    idempotency_max_keys: int = 1_000_000
    idempotency_max_producers: int = 10_000
    client_timeout: float = 60.0  # no flag upstream (default heartbeat = half of it)

    # client overridable configuration options
    max_heartbeat_interval: float = 60.0
    max_rdy_count: int = 2500
    max_output_buffer_size: int = 65536
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    max_channel_consumers: int = 0

    # statsd
    statsd_address: str = ""
    statsd_prefix: str = "nsq.%s"
    statsd_interval: float = 60.0
    statsd_mem_stats: bool = True
    statsd_udp_packet_size: int = 508
    statsd_exclude_ephemeral: bool = False

    # e2e message latency
    e2e_processing_latency_window_time: float = 600.0
    e2e_processing_latency_percentiles: list[float] = field(default_factory=list)

    # TLS
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_auth_policy: str = ""
    tls_root_ca_file: str = ""
    tls_required: int = TLS_NOT_REQUIRED
    tls_min_version: str = "tls1.0"

    # compression
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True

    # experiments
    enable_experiment: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ helpers
    def has_experiment(self, name: str) -> bool:
        return name in self.enable_experiment

    @property
    def tls_min_version_ssl(self) -> ssl.TLSVersion:
        return _SSL_VERSIONS[self.tls_min_version]

    @property
    def max_delay_ms(self) -> int:
        """Ceiling of DPUB/REQ/defer delays: --max-delay when set, else --max-req-timeout."""
        return int((self.max_delay or self.max_req_timeout) * 1000)

    @property
    def log_level_number(self) -> int:
        return LOG_LEVELS[self.log_level]

    def validate(self) -> None:
        """Upstream's start-up checks (nsqd.New); also normalises tls_required."""
        if not 1 <= self.max_deflate_level <= 9:
            raise OptionsError("--max-deflate-level must be [1,9]")
        if not 0 <= self.node_id < 1024:
            raise OptionsError("--node-id must be [0,1024)")
        if self.log_level not in LOG_LEVELS:
            raise OptionsError(
                f"invalid log level '{self.log_level}' (debug, info, warn, error, fatal)"
            )
        if self.tls_min_version not in TLS_VERSIONS:
            raise OptionsError(f"unknown tlsVersionOption {self.tls_min_version!r}")
        if self.tls_required not in (TLS_NOT_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_REQUIRED):
            raise OptionsError(f"invalid tls_required {self.tls_required!r}")
        if self.tls_client_auth_policy not in ("", "require", "require-verify"):
            raise OptionsError(
                f"invalid --tls-client-auth-policy {self.tls_client_auth_policy!r}"
                " (must be 'require' or 'require-verify')"
            )
        if self.tls_client_auth_policy and self.tls_required == TLS_NOT_REQUIRED:
            self.tls_required = TLS_REQUIRED
        if self.tls_required != TLS_NOT_REQUIRED and not (self.tls_cert and self.tls_key):
            raise OptionsError("cannot require TLS client connections without TLS key and cert")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise OptionsError("--tls-cert and --tls-key must be given together")
        if self.auth_http_request_method not in ("get", "post"):
            raise OptionsError("--auth-http-request-method must be post or get")
        for p in self.e2e_processing_latency_percentiles:
            if not 0 < p <= 1:
                raise OptionsError(f"invalid E2E processing latency percentile: {p:g}")
        for e in self.enable_experiment:
            if e not in EXPERIMENTS:
                raise OptionsError(f"unknown experiment {e!r} (valid: {', '.join(EXPERIMENTS)})")
        for name in ("max_bytes_per_file", "sync_every", "max_msg_size", "max_body_size",
                     "max_rdy_count", "statsd_udp_packet_size", "queue_scan_worker_pool_max",
                     "queue_scan_selection_count"):
            if getattr(self, name) <= 0:
                raise OptionsError(f"--{name.replace('_', '-')} must be > 0")
        if self.mem_queue_size < 0:
            raise OptionsError("--mem-queue-size must be >= 0")
        for name in ("msg_timeout", "max_msg_timeout", "max_req_timeout", "sync_timeout",
                     "max_heartbeat_interval", "statsd_interval", "max_attempts", "msg_ttl",
                     "max_delay"):
            if getattr(self, name) < 0:
                raise OptionsError(f"--{name.replace('_', '-')} must not be negative")
        if self.archive_compression not in ARCHIVE_CODECS:  # "" skips the flag's check
            raise OptionsError(f"--archive-compression must be one of {', '.join(ARCHIVE_CODECS)}")
        if self.archive_url:  # nsqx tiered storage
            try:
                parse_archive_url(self.archive_url)
            except ValueError as e:
                raise OptionsError(f"--archive-url: {e}") from None
            if importlib.util.find_spec("pyarrow") is None:
                raise OptionsError(f"--archive-url needs pyarrow: {install_command('archive')}")
        if self.statsd_address and self.statsd_interval <= 0:
            raise OptionsError("--statsd-interval must be > 0")
        # the same ceilings as /channel/config and /topic/config (attempts: 16-bit field)
        if self.max_attempts > 65535:
            raise OptionsError("--max-attempts must be <= 65535")
        if self.msg_ttl > 366 * 24 * 3600:
            raise OptionsError("--msg-ttl must be <= 8784h0m0s (366 days)")
        if self.workers < 1:
            raise OptionsError("--workers must be >= 1 (or auto)")
        if self.workers > 1:
            # what the first step of the workers (issue 32) does not cover yet: refused
            # at start with the reason, never half working
            if self.cluster_leadership_addresses:
                raise OptionsError("--workers > 1 is not supported in cluster mode yet "
                                   "(--cluster-leadership-address): use --workers=1")
            if self.auth_http_addresses:
                raise OptionsError("--workers > 1 is not supported with "
                                   "--auth-http-address yet: use --workers=1")
            if self.tls_required != TLS_NOT_REQUIRED:
                raise OptionsError("--workers > 1 is not supported with --tls-required "
                                   "yet: use --workers=1")
            if self.archive_url:
                raise OptionsError("--workers > 1 is not supported with --archive-url "
                                   "yet: use --workers=1")
        if self.idempotency_window <= 0:
            raise OptionsError("--idempotency-window must be > 0")
        if self.idempotency_max_keys < 1 or self.idempotency_max_producers < 1:
            raise OptionsError("--idempotency-max-keys and --idempotency-max-producers "
                               "must be >= 1")

    def go_value(self, cfg_name: str) -> Any:
        """The option as upstream's ``GET /config/:opt`` shows it; KeyError if no such option."""
        flag = _CFG_INDEX.get(cfg_name)
        if flag is None:
            raise KeyError(cfg_name)
        v = getattr(self, flag.dest)
        if flag.kind == "duration":
            return round(v * 1e9)
        if flag.dest == "log_level":
            return LOG_LEVELS.get(v, 0)
        if flag.dest == "tls_min_version":
            return TLS_VERSIONS.get(v, 0)
        if isinstance(v, list):
            return list(v)
        return v


# ---------------------------------------------------------------- flag table

def _parse_tls_required(s: str) -> int:
    s = s.lower()
    if s == "tcp-https":
        return TLS_REQUIRED_EXCEPT_HTTP
    return TLS_REQUIRED if parse_go_bool(s) else TLS_NOT_REQUIRED


def _parse_tls_min_version(s: str) -> str:
    s = s.lower()
    if s not in TLS_VERSIONS:
        raise FlagError(f"unknown tlsVersionOption {s!r}")
    return s


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), as Go's GOMAXPROCS."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _parse_workers(s: str) -> int:
    s = s.strip().lower()
    if s == "auto":
        return usable_cores()
    try:
        n = int(s)
    except ValueError:
        raise FlagError(f"invalid --workers {s!r} (a number >= 1, or auto)") from None
    if n < 1:
        raise FlagError(f"invalid --workers {s!r} (a number >= 1, or auto)")
    return n


def _check_data_path(path: str) -> str:
    """Fail at start, in one line, on a data path nsqd cannot use: not a directory, or not
    writable (it, or the nearest existing parent it would be created in)."""
    p = os.path.abspath(path)
    if os.path.exists(p) and not os.path.isdir(p):
        raise ValueError("not a directory")
    while not os.path.exists(p):
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        raise ValueError(f"{p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"{p} is not writable")
    return path


def _flags() -> list[Flag]:
    d = Options(node_id=0, broadcast_address="", data_path="")
    STR, INT, DUR, BOOL = "string", "int", "duration", "bool"
    return [
        # basic options
        *basic_flags(d.log_prefix),
        Flag("node-id", INT, 0, "unique part for message IDs, (int) in range [0,1024) "
             "(default is hash of hostname)", dest="node_id", cfg="id", default_text=""),
        Flag("worker-id", BOOL, False, "[deprecated] use --node-id", deprecated=True),
        Flag("workers", "custom", 1, "[nsqx] worker processes behind this node's ports, each "
             "its own event loop owning a share of the topics (auto = the usable cores); "
             "EXPERIMENTAL: 1, one process, is the default until every test suite passes "
             "with auto, which will then become the default (docs/operations.md lists what "
             "--workers > 1 does not do yet)", parse=_parse_workers, default_text="1"),
        listen_flag("https-address", d.https_address,
                    "<addr>:<port> to listen on for HTTPS clients"),
        listen_flag("http-address", d.http_address, "address to listen on for HTTP clients "
                    "(<addr>:<port> for TCP/IP or <path> for unix socket)"),
        listen_flag("tcp-address", d.tcp_address, "address to listen on for TCP clients "
                    "(<addr>:<port> for TCP/IP or <path> for unix socket)"),
        peer_flag("auth-http-address", "<addr>:<port> or a full url to query auth server (may "
                  "be given multiple times)", dest="auth_http_addresses"),
        Flag("auth-http-request-method", STR, d.auth_http_request_method,
             "HTTP method to use for auth server requests"),
        Flag("broadcast-address", STR, "", "address that will be registered with lookupd "
             "(defaults to the OS hostname)"),
        Flag("broadcast-tcp-port", INT, 0, "TCP port that will be registered with lookupd "
             "(defaults to the TCP port that this nsqd is listening on)"),
        Flag("broadcast-http-port", INT, 0, "HTTP port that will be registered with lookupd "
             "(defaults to the HTTP port that this nsqd is listening on)"),
        peer_flag("lookupd-tcp-address", "lookupd TCP address (may be given multiple times)",
                  dest="nsqlookupd_tcp_addresses"),
        *http_client_flags(d.http_client_connect_timeout, d.http_client_request_timeout),
        *cluster_flags(d.cluster_id, "(http://127.0.0.1:2379, comma separated or repeated); "
                       "cluster mode is on exactly when set"),
        Flag("cluster-node-ttl", DUR, d.cluster_node_ttl, "[nsqx] lease of this node's "
             "membership in etcd: a node silent this long is considered dead"),
        *cluster_trust_flags("requests between members are signed with it and internal "
                             "endpoints refuse unsigned ones"),
        listen_flag("cluster-address", "", "[nsqx] <addr>:<port> of the listener serving other "
                    "members (replication, route calls); default: the HTTP host, a port the "
                    "OS picks, published in etcd"),
        choice_flag("cluster-replication", ("stream", "http"), "[nsqx] how this node fetches "
                    "as a follower: one authenticated stream per leader on its cluster "
                    "listener, or one HTTP request per fetch (members that predate the stream "
                    "are fetched from over HTTP either way)"),
        Flag("broadcast-cluster-port", INT, 0, "[nsqx] port of the cluster listener that will be "
             "registered in etcd (defaults to the port it listens on)"),
        Flag("topology-region", STR, "", "A region represents a larger domain, made up of one or "
             "more zones for preferring closer consumer"),
        Flag("topology-zone", STR, "", "A zone represents a logical failure domain for preferring "
             "closer consumer"),
        # storage
        Flag("data-path", STR, "", "path to store disk-backed messages (default is the current "
             "directory)", check=_check_data_path),
        Flag("mem-queue-size", INT, d.mem_queue_size, "number of messages to keep in memory "
             "(per topic/channel)"),
        Flag("max-bytes-per-file", INT, d.max_bytes_per_file, "number of bytes per log segment "
             "file before rolling"),
        Flag("sync-every", INT, d.sync_every, "number of messages per fsync"),
        Flag("sync-timeout", DUR, d.sync_timeout, "duration of time per fsync (fsync at least "
             "this often when there are unsynced writes)"),
        Flag("retention-time", DUR, d.retention_time, "[nsqx] keep consumed log segments at "
             "least this long for replay (0 = delete once every channel consumed them)"),
        Flag("retention-bytes", INT, d.retention_bytes, "[nsqx] keep up to this many bytes of "
             "consumed log per topic for replay (0 = none)"),
        Flag("max-log-bytes", INT, d.max_log_bytes, "[nsqx] hard cap of a topic's log; beyond "
             "it the oldest segments go even if channels lag, and they skip them (0 = no cap)"),
        Flag("mem-tail-budget", INT, d.mem_tail_budget, "[nsqx] bytes of the newest messages "
             "kept in memory for readers that keep up, all topics together (each durable topic "
             "gets an even share, 16 KiB to 8 MiB; older messages are read from the log)"),
        Flag("queue-scan-worker-pool-max", INT, d.queue_scan_worker_pool_max, "max concurrency "
             "for checking in-flight and deferred message timeouts"),
        Flag("queue-scan-selection-count", INT, d.queue_scan_selection_count, "number of channels "
             "to check per cycle (every 100ms) for in-flight and deferred timeouts"),
        # msg and command options
        Flag("msg-timeout", DUR, d.msg_timeout, "default duration to wait before auto-requeing "
             "a message"),
        Flag("max-msg-timeout", DUR, d.max_msg_timeout, "maximum duration before a message will "
             "timeout"),
        Flag("max-msg-size", INT, d.max_msg_size, "maximum size of a single message in bytes"),
        Flag("max-req-timeout", DUR, d.max_req_timeout, "maximum requeuing timeout for a message"),
        Flag("max-delay", DUR, d.max_delay, "[nsqx] longest delay DPUB, REQ and /pub?defer= "
             "may ask for, e.g. 72h: delayed messages wait in the on-disk delay store "
             "(0 = --max-req-timeout's value, upstream's limit)"),
        Flag("max-attempts", INT, d.max_attempts, "[nsqx] deliveries of a message on a channel "
             "before it is moved to the dead-letter topic <topic>.dlq instead of being "
             "delivered again (0 = never, as upstream; per channel: /channel/config)"),
        Flag("msg-ttl", DUR, d.msg_ttl, "[nsqx] messages published longer ago than this are "
             "skipped (finished unseen, counted as expired) when a channel reaches them "
             "(0 = kept; per topic: /topic/config)"),
        Flag("idempotency-window", DUR, d.idempotency_window, "[nsqx] how long a partition "
             "remembers an Idempotency-Key or an idempotent producer's sequence (a retry "
             "later than this is stored again)"),
        Flag("idempotency-max-keys", INT, d.idempotency_max_keys, "[nsqx] Idempotency-Keys "
             "each partition remembers at most (the oldest are forgotten first)"),
        Flag("idempotency-max-producers", INT, d.idempotency_max_producers, "[nsqx] "
             "idempotent producer ids each partition remembers at most (least recent first)"),
        Flag("max-body-size", INT, d.max_body_size, "maximum size of a single command body"),
        # client overridable configuration options
        Flag("max-heartbeat-interval", DUR, d.max_heartbeat_interval, "maximum client "
             "configurable duration of time between client heartbeats"),
        Flag("max-rdy-count", INT, d.max_rdy_count, "maximum RDY count for a client"),
        Flag("max-output-buffer-size", INT, d.max_output_buffer_size, "maximum client "
             "configurable size (in bytes) for a client output buffer"),
        Flag("max-output-buffer-timeout", DUR, d.max_output_buffer_timeout, "maximum client "
             "configurable duration of time between flushing to a client"),
        Flag("min-output-buffer-timeout", DUR, d.min_output_buffer_timeout, "minimum client "
             "configurable duration of time between flushing to a client"),
        Flag("output-buffer-timeout", DUR, d.output_buffer_timeout, "default duration of time "
             "between flushing data to clients"),
        Flag("max-channel-consumers", INT, 0, "maximum channel consumer connection count per nsqd "
             "instance (default 0, i.e., unlimited)"),
        # nsqx tiered storage
        Flag("archive-url", STR, "", "[nsqx] archive closed log segments as Parquet files to this "
             "directory or s3://bucket/prefix; old reads are served from there"),
        Flag("archive-s3-endpoint", STR, "", "[nsqx] S3 endpoint (host:port or URL) for an s3:// "
             "--archive-url (credentials from the AWS environment variables)"),
        choice_flag("archive-compression", tuple(ARCHIVE_CODECS), "[nsqx] Parquet codec of the "
                    "archived files, as Kafka's compression.type (readers need no setting)"),
        # statsd
        peer_flag("statsd-address", "UDP <addr>:<port> of a statsd daemon for pushing stats",
                  many=False),
        Flag("statsd-interval", DUR, d.statsd_interval, "duration between pushing to statsd"),
        Flag("statsd-mem-stats", BOOL, d.statsd_mem_stats, "toggle sending memory and GC stats "
             "to statsd"),
        Flag("statsd-prefix", STR, d.statsd_prefix, "prefix used for keys sent to statsd "
             "(%s for host replacement)"),
        Flag("statsd-udp-packet-size", INT, d.statsd_udp_packet_size, "the size in bytes of "
             "statsd UDP packets"),
        Flag("statsd-exclude-ephemeral", BOOL, False, "Skip ephemeral topics and channels when "
             "sending stats to statsd"),
        # e2e
        Flag("e2e-processing-latency-percentile", "floats", [], "message processing time "
             "percentiles (as float (0, 1.0]) to track (can be specified multiple times or "
             "comma separated '1.0,0.99,0.95', default none)",
             dest="e2e_processing_latency_percentiles"),
        Flag("e2e-processing-latency-window-time", DUR, d.e2e_processing_latency_window_time,
             "calculate end to end latency quantiles for this duration of time (ie: 60s would "
             "only show quantile calculations from the past 60 seconds)"),
        # TLS
        Flag("tls-cert", STR, "", "path to certificate file"),
        Flag("tls-key", STR, "", "path to key file"),
        Flag("tls-client-auth-policy", STR, "", "client certificate auth policy ('require' or "
             "'require-verify')"),
        Flag("tls-root-ca-file", STR, "", "path to certificate authority file"),
        Flag("tls-required", "custom", TLS_NOT_REQUIRED, "require TLS for client connections "
             "(true, false, tcp-https)", parse=_parse_tls_required, is_bool=True,
             default_text=""),
        Flag("tls-min-version", "custom", "tls1.0", "minimum SSL/TLS version acceptable "
             "('tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')", parse=_parse_tls_min_version,
             default_text="tls1.0"),
        # compression
        Flag("deflate", BOOL, True, "enable deflate feature negotiation (client compression)"),
        Flag("max-deflate-level", INT, d.max_deflate_level, "max deflate compression level a "
             "client can negotiate (> values == > nsqd CPU usage)"),
        Flag("snappy", BOOL, True, "enable snappy feature negotiation (client compression)"),
        Flag("enable-experiment", "strings", [], "enable experimental feature (may be given "
             "multiple times) (valid options: " + ", ".join(f'"{e}"' for e in EXPERIMENTS) + ")"),
    ]


def _prepare(values: dict[str, Any]) -> None:
    if "e2e_processing_latency_percentiles" in values:
        # upstream FloatArray keeps them sorted, largest first
        values["e2e_processing_latency_percentiles"] = sorted(
            values["e2e_processing_latency_percentiles"], reverse=True)


# "" for --broadcast-address / --data-path means the default (hostname / current directory)
PROGRAM = Program("nsqd", Options, _flags, (OptionsError,),
                  empty_is_default=("broadcast_address", "data_path"), prepare=_prepare)
_CFG_INDEX = PROGRAM.cfg_index
_FIELD_NAMES = {f.name for f in fields(Options)}
assert all(f.dest in _FIELD_NAMES for f in _CFG_INDEX.values())


# the module's API (the entry point and the server use these names)
flag_set = PROGRAM.flag_set
version_string = PROGRAM.version
load = PROGRAM.load  # argv (+ --config) -> (validated Options, extras {help, version})
parse_args = PROGRAM.parse_args  # exits 0 after --help/--version, 2 on a bad flag
