"""A small command-line flag parser that accepts Go's and GNU's syntaxes, and the pieces the
programs' flag tables are built from.

Every nsqx program keeps upstream's flag names, so scripts written for the Go
binaries (``-tcp-address=...``, ``-lookupd-tcp-address h:p -lookupd-tcp-address
h2:p``) work unchanged, and so do GNU habits (``--flag value``). argparse can't
do Go's single-dash long flags nor Go's bare/``=false`` booleans, hence this.

The parser only turns ``argv`` into ``{dest: value}`` for the flags that were
given; programs merge that over a config file and their defaults (Go's
``go-options`` precedence: command line > config file > default).

Each server program declares one table (:class:`Program`: its ``Options`` dataclass and its
flags, built from the shared pieces :func:`basic_flags`, :func:`cluster_flags`,
:func:`http_client_flags`, :func:`listen_flag`, :func:`peer_flag`); the program's module
only adds its own flags and checks. This module sits below the servers (it knows nothing of
them), so ``nsqd``, ``nsqlookupd``, ``nsqadmin`` and the tools all import it.
"""

from __future__ import annotations

import platform
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nsqx import NSQ_VERSION, __version__
from nsqx.netutil import check_listen_address, check_peer_address

__all__ = [
    "LOG_LEVELS",
    "Flag",
    "FlagError",
    "FlagSet",
    "Program",
    "basic_flags",
    "choice_flag",
    "cluster_flags",
    "http_client_flags",
    "listen_flag",
    "peer_flag",
    "format_go_duration",
    "parse_go_bool",
    "parse_go_duration",
    "parse_go_int",
]


class FlagError(ValueError):
    """A bad flag or flag value; the message is meant for the user as is."""


# ---------------------------------------------------------------- Go value syntax

_GO_BOOLS = {
    "1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
    "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False,
}


def parse_go_bool(s: str) -> bool:
    """strconv.ParseBool: the spellings Go accepts, nothing else."""
    try:
        return _GO_BOOLS[s]
    except KeyError:
        raise FlagError(f"invalid boolean value {s!r}") from None


_INT_RE = re.compile(r"[+-]?(0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*)")


def parse_go_int(s: str) -> int:
    """strconv.ParseInt(s, 0, 64): decimal, 0x/0o/0b prefixes, a sign; int64 range."""
    if not _INT_RE.fullmatch(s):
        raise FlagError(f"invalid integer value {s!r}")
    try:
        v = int(s, 0)
    except ValueError:
        # Go reads a leading 0 as octal ("010" == 8); Python refuses it.
        body = s.lstrip("+-")
        if body.isdigit():
            try:
                v = int(body, 8) * (-1 if s.startswith("-") else 1)
            except ValueError:
                raise FlagError(f"invalid integer value {s!r}") from None
        else:
            raise FlagError(f"invalid integer value {s!r}") from None
    if not -(2**63) <= v < 2**63:
        raise FlagError(f"integer value {s!r} out of range")
    return v


def parse_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise FlagError(f"invalid float value {s!r}") from None
    if s.strip() != s or "_" in s:
        raise FlagError(f"invalid float value {s!r}")
    return v


_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_DURATION_FULL = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+")


def parse_go_duration_ns(s: str) -> int:
    """time.ParseDuration -> integer nanoseconds ("1h2m3.5s", "250ms", "0")."""
    if s in ("0", "+0", "-0"):
        return 0
    if not _DURATION_FULL.fullmatch(s):
        if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)", s):
            raise FlagError(f"missing unit in duration {s!r}")
        raise FlagError(f"invalid duration {s!r}")
    total = 0.0
    for num, unit in _DURATION_PART.findall(s):
        total += float(num) * _DURATION_UNITS_NS[unit]
    ns = round(total)
    if ns >= 2**63:
        raise FlagError(f"invalid duration {s!r}")
    return -ns if s.startswith("-") else ns


def parse_go_duration(s: str) -> float:
    """time.ParseDuration -> float seconds (how nsqx stores durations)."""
    return parse_go_duration_ns(s) / 1e9


def _frac(value: int, unit: int) -> str:
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{rest:0{digits}d}".rstrip("0")


def format_go_duration(seconds: float | int, *, ns: int | None = None) -> str:
    """time.Duration.String(): "1m0s", "250ms", "1h0m0s", "0s" (for --help and /stats)."""
    n = ns if ns is not None else round(seconds * 1e9)
    sign = "-" if n < 0 else ""
    u = abs(n)
    if u == 0:
        return "0s"
    if u < 1_000_000_000:
        if u < 1_000:
            return f"{sign}{u}ns"
        if u < 1_000_000:
            return f"{sign}{_frac(u, 1_000)}\u00b5s"
        return f"{sign}{_frac(u, 1_000_000)}ms"
    h, rem = divmod(u, 3_600_000_000_000)
    m, rem = divmod(rem, 60_000_000_000)
    out = sign
    if h:
        out += f"{h}h"
    if h or m:
        out += f"{m}m"
    return out + _frac(rem, 1_000_000_000) + "s"


# ---------------------------------------------------------------- flags

_KINDS = ("bool", "int", "float", "string", "duration", "strings", "floats", "custom")
_TYPE_NAMES = {
    "bool": "",
    "int": "int",
    "float": "float",
    "string": "string",
    "duration": "duration",
    "strings": "value",
    "floats": "value",
    "custom": "value",
}


@dataclass
class Flag:
    """One flag. ``dest`` is the attribute it sets, ``cfg`` its config-file key.

    kind: bool | int | float | string | duration (float seconds) | strings
    (repeatable, appends) | floats (repeatable, comma lists, like upstream's
    FloatArray) | custom (``parse`` turns the text into the value).
    """

    name: str
    kind: str
    default: Any
    help: str
    dest: str = ""
    cfg: str = ""
    parse: Callable[[str], Any] | None = None
    is_bool: bool = False  # custom flags that may appear bare (like Go's IsBoolFlag)
    default_text: str | None = None  # override of "(default ...)" in --help
    deprecated: bool = False  # accepted, ignored
    # string/strings flags: checks one value, ValueError(reason) if bad (address flags fail
    # at start with Go's "invalid value ... for flag -name: reason", not when first used)
    check: Callable[[str], str] | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown flag kind {self.kind!r}")
        if not self.dest:
            self.dest = self.name.replace("-", "_")
        if not self.cfg:
            self.cfg = self.dest
        if self.kind == "bool":
            self.is_bool = True

    def convert(self, text: str) -> Any:
        """Parse one command-line occurrence (for lists: one item or comma list)."""
        if self.kind == "bool":
            return parse_go_bool(text)
        if self.kind == "int":
            return parse_go_int(text)
        if self.kind == "float":
            return parse_float(text)
        if self.kind == "duration":
            return parse_go_duration(text)
        if self.kind == "strings" or self.kind == "string":
            return self._checked(text)
        if self.kind == "floats":
            return [parse_float(p.strip()) for p in text.split(",")]
        assert self.parse is not None, self.name
        return self.parse(text)

    def _checked(self, text: str) -> str:
        if self.check is not None and text:
            try:
                self.check(text)
            except ValueError as e:
                raise FlagError(str(e)) from None
        return text

    def coerce_config(self, value: Any) -> Any:
        """A config-file value -> the flag's value (go-options' coercion rules)."""
        k = self.kind
        if k == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, int):
                return value != 0
            if isinstance(value, str):
                return parse_go_bool(value)
        elif k == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, str):
                return parse_go_int(value)
        elif k == "float":
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            if isinstance(value, str):
                return parse_float(value)
        elif k == "string":
            if isinstance(value, str):
                return self._checked(value)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return self._checked(str(value))
        elif k == "duration":
            if isinstance(value, str):
                return parse_go_duration(value)
            if isinstance(value, int) and not isinstance(value, bool):
                return value / 1000.0  # go-options: a bare number is milliseconds
        elif k == "strings":
            if isinstance(value, str):
                return [self._checked(v) for v in value.split(",")]
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return [self._checked(v) for v in value]
        elif k == "floats":
            if isinstance(value, str):
                return [parse_float(p.strip()) for p in value.split(",")]
            if isinstance(value, list) and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in value
            ):
                return [float(v) for v in value]
            if isinstance(value, int | float) and not isinstance(value, bool):
                return [float(value)]
        else:
            assert self.parse is not None
            if isinstance(value, bool):
                return self.parse("true" if value else "false")
            if isinstance(value, str | int | float):
                return self.parse(str(value))
        raise FlagError(f"invalid value {value!r} ({type(value).__name__})")

    def help_entry(self) -> str:
        """Go's flag.PrintDefaults() entry for this flag."""
        type_name = _TYPE_NAMES[self.kind]
        if self.kind == "custom" and self.is_bool:
            type_name = "value"
        head = f"  -{self.name}"
        if type_name:
            head += f" {type_name}"
        text = self.help
        shown = self.default_text
        if shown is None:
            shown = self._default_text()
        if shown:
            text += f" (default {shown})"
        return f"{head}\n    \t{text}"

    def _default_text(self) -> str:
        d = self.default
        if self.kind == "bool":
            return "true" if d else ""
        if self.kind == "string":
            return f'"{d}"' if d else ""
        if self.kind == "duration":
            return format_go_duration(d) if d else ""
        if self.kind in ("int", "float"):
            return str(d) if d else ""
        if self.kind in ("strings", "floats"):
            return ",".join(str(x) for x in d) if d else ""
        return str(d) if d not in (None, "", 0, False) else ""


def listen_flag(name: str, default: str, help: str, **kw: Any) -> Flag:
    """A ``host:port`` to listen on; a bad port or an unresolvable host fails at start."""
    return Flag(name, "string", default, help, check=check_listen_address, **kw)


def peer_flag(name: str, help: str, *, many: bool = True, default: Any = None,
              **kw: Any) -> Flag:
    """Another program's ``host:port`` (HTTP peers may be URLs); ``many``: repeatable."""
    if default is None:
        default = [] if many else ""
    return Flag(name, "strings" if many else "string", default, help,
                check=check_peer_address, **kw)


def choice_flag(name: str, choices: Sequence[str], help: str, **kw: Any) -> Flag:
    """A string that must be one of ``choices`` (the first is the default); another value
    fails at start, naming the ones accepted."""
    def check(text: str) -> str:
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text

    return Flag(name, "string", choices[0], f"{help} ({'|'.join(choices)})", check=check, **kw)


class FlagSet:
    """An ordered set of flags for one program."""

    def __init__(self, prog: str, flags: Iterable[Flag] = ()) -> None:
        self.prog = prog
        self._flags: dict[str, Flag] = {}
        for f in flags:
            self.add(f)

    def add(self, flag: Flag) -> Flag:
        if flag.name in self._flags:
            raise ValueError(f"flag redefined: {flag.name}")
        self._flags[flag.name] = flag
        return flag

    def __iter__(self):
        return iter(self._flags.values())

    def __contains__(self, name: str) -> bool:
        return name in self._flags

    def get(self, name: str) -> Flag | None:
        return self._flags.get(name)

    def by_cfg(self) -> dict[str, Flag]:
        return {f.cfg: f for f in self._flags.values()}

    def parse(self, argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
        """Parse ``argv`` -> ({dest: value} of the flags given, positional arguments).

        ``-h``/``-help``/``--help`` come back as dest ``help`` = True. Parsing
        stops at ``--``; positionals are returned (callers decide if they're allowed).
        """
        values: dict[str, Any] = {}
        positional: list[str] = []
        args = list(argv)
        i = 0
        while i < len(args):
            arg = args[i]
            i += 1
            if arg == "--":
                positional.extend(args[i:])
                break
            if len(arg) < 2 or arg[0] != "-" or arg == "-":
                positional.append(arg)
                continue
            body = arg[2:] if arg.startswith("--") else arg[1:]
            if not body or body[0] in "-=":
                raise FlagError(f"bad flag syntax: {arg}")
            name, has_value, value = body.partition("=")
            if name in ("h", "help") and name not in self._flags:
                values["help"] = True
                continue
            flag = self._flags.get(name)
            if flag is None:
                raise FlagError(f"flag provided but not defined: -{name}")
            if not has_value:
                if flag.is_bool:
                    value = "true"
                elif i < len(args):
                    value = args[i]
                    i += 1
                else:
                    raise FlagError(f"flag needs an argument: -{name}")
            try:
                converted = flag.convert(value)
            except FlagError as e:
                raise FlagError(f'invalid value "{value}" for flag -{name}: {e}') from None
            if flag.kind == "strings":
                values.setdefault(flag.dest, []).append(converted)
            elif flag.kind == "floats":
                values.setdefault(flag.dest, []).extend(converted)
            else:
                values[flag.dest] = converted
        return values, positional

    def usage(self) -> str:
        """Go's "Usage of prog:" text: every flag, sorted, with default and help."""
        lines = [f"Usage of {self.prog}:"]
        for name in sorted(self._flags):
            lines.append(self._flags[name].help_entry())
        return "\n".join(lines) + "\n"


def load_toml(path: str) -> dict[str, Any]:
    """A `--config` TOML file; errors say which file and why (as upstream's)."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as e:
        raise FlagError(f"failed to load config file {path} - {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise FlagError(f"failed to load config file {path} - {e}") from None


def parse_or_exit(prog: str, argv: Sequence[str] | None,
                  load: Callable[[Sequence[str]], tuple[Any, dict[str, Any]]],
                  usage: Callable[[], str], version: Callable[[], str],
                  errors: tuple[type[Exception], ...] = ()) -> Any:
    """The command line -> options; `--help`/`--version` print and exit 0, a bad flag or
    option prints the problem and exits 2 (Go's flag package behaviour)."""
    import sys

    if argv is None:
        argv = sys.argv[1:]
    try:
        opts, extras = load(argv)
    except (FlagError, *errors) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        print(f"Run '{prog} --help' for the list of flags.", file=sys.stderr)
        raise SystemExit(2) from None
    if extras["help"]:
        sys.stdout.write(usage())
        raise SystemExit(0)
    if extras["version"]:
        print(version())
        raise SystemExit(0)
    return opts


def command_line_values(prog: str, flags: FlagSet, cfg_index: dict[str, Flag],
                        argv: Sequence[str],
                        ignored: Iterable[str] = ("verbose",)) -> tuple[dict[str, Any], dict[str, Any]]:
    """argv (+ its ``--config`` TOML) -> (option values by field, extras {help, version}).

    Precedence is upstream's: command line > config file > default. Unknown config keys
    are ignored with a warning (upstream ignores them silently; a typo deserves a word).
    """
    import sys

    given, positional = flags.parse(argv)
    extras = {"help": given.pop("help", False), "version": given.pop("version", False)}
    if extras["help"] or extras["version"]:
        return {}, extras
    if positional:
        raise FlagError(f"unexpected argument {positional[0]!r} (flags take the form -name=value)")
    config_path = given.pop("config", "")
    for name in ignored:
        given.pop(name, None)
    values: dict[str, Any] = {}
    if config_path:
        for key, raw in load_toml(config_path).items():
            flag = cfg_index.get(key)
            if flag is None:
                print(f"[{prog}] WARNING: config file {config_path}: unknown option {key!r} "
                      "ignored", file=sys.stderr)
                continue
            try:
                values[flag.dest] = flag.coerce_config(raw)
            except FlagError as e:
                raise FlagError(f"config file {config_path}: failed parsing {key} - {e}") from None
    values.update(given)
    return values, extras


# ---------------------------------------------------------------- shared pieces of the tables

# upstream lg.LogLevel numbers (what nsqd's /config/log_level shows)
LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}


def parse_log_level(s: str) -> str:
    s = s.lower()
    if s not in LOG_LEVELS:
        raise FlagError(f"invalid log level '{s}' (debug, info, warn, error, fatal)")
    return s


def basic_flags(log_prefix: str) -> list[Flag]:
    """What every server has: --config, --version, --log-level, --log-prefix, --verbose."""
    return [
        Flag("config", "string", "", "path to config file"),
        Flag("version", "bool", False, "print version string"),
        Flag("log-level", "custom", "info", "set log verbosity: debug, info, warn, error, or fatal",
             parse=parse_log_level, default_text="info"),
        Flag("log-prefix", "string", log_prefix, "log message prefix"),
        Flag("verbose", "bool", False, "[deprecated] has no effect, use --log-level",
             deprecated=True),
    ]


def cluster_flags(cluster_id: str, leadership_help: str) -> list[Flag]:
    """nsqx's cluster mode (Youzan's names): the etcd prefix and etcd's URLs."""
    return [
        Flag("cluster-id", "string", cluster_id, "[nsqx] cluster name: the etcd key prefix "
             "/nsqx/<id>/ shared by the nsqd and nsqlookupd of one cluster"),
        peer_flag("cluster-leadership-addresses", "[nsqx] etcd client URLs " + leadership_help,
                  dest="cluster_leadership_addresses"),
    ]


def cluster_trust_flags(role: str) -> list[Flag]:
    """How cluster members know each other (``role``: who uses the credentials): the shared
    secret that signs node-to-node requests and mutual TLS between members."""
    return [
        Flag("cluster-secret-file", "string", "", "[nsqx] file holding the cluster's shared "
             "secret (the same file on every nsqd and nsqlookupd of the cluster): " + role),
        Flag("cluster-tls-cert", "string", "", "[nsqx] mutual TLS between cluster members "
             "(with -key, -ca): this program's certificate"),
        Flag("cluster-tls-key", "string", "", "[nsqx] key of --cluster-tls-cert"),
        Flag("cluster-tls-ca", "string", "", "[nsqx] CA every member's certificate chains to"),
    ]


def http_client_flags(connect: float, request: float) -> list[Flag]:
    """Timeouts of the program's own HTTP client (upstream's names)."""
    return [
        Flag("http-client-connect-timeout", "duration", connect, "timeout for HTTP connect"),
        Flag("http-client-request-timeout", "duration", request, "timeout for HTTP request"),
    ]


@dataclass
class Program:
    """One server program's declarative flag table: its ``Options`` dataclass (whose
    ``validate()`` raises one of ``errors``) and its flags; loads argv + ``--config`` with
    upstream's precedence (command line > config file > default).

    ``empty_is_default``: options where "" means "the default" (the hostname, the current
    directory); ``prepare`` may adjust the values before ``Options(**values)``."""

    name: str
    options: Callable[..., Any]
    table: Callable[[], list[Flag]]
    errors: tuple[type[Exception], ...] = ()
    empty_is_default: tuple[str, ...] = ()
    prepare: Callable[[dict[str, Any]], None] | None = None
    _index: dict[str, Flag] = field(default_factory=dict, init=False, repr=False)

    def flag_set(self) -> FlagSet:
        return FlagSet(self.name, self.table())

    @property
    def cfg_index(self) -> dict[str, Flag]:
        """Config-file key -> flag, for the flags that are options (not --config,
        --version or deprecated ones)."""
        if not self._index:
            self._index.update((f.cfg, f) for f in self.table()
                               if f.name not in ("config", "version") and not f.deprecated)
        return self._index

    def version(self) -> str:
        return (f"{self.name} v{NSQ_VERSION} (built w/python{platform.python_version()}) "
                f"nsqx/{__version__}")

    def load(self, argv: Sequence[str]) -> tuple[Any, dict[str, Any]]:
        """argv (+ ``--config``) -> (validated Options, extras {help, version})."""
        ignored = [f.dest for f in self.table() if f.deprecated]
        values, extras = command_line_values(self.name, self.flag_set(), self.cfg_index, argv,
                                             ignored)
        if extras["help"] or extras["version"]:
            return self.options(), extras
        for key in self.empty_is_default:
            if values.get(key) == "":
                del values[key]
        if self.prepare is not None:
            self.prepare(values)
        opts = self.options(**values)
        opts.validate()
        return opts, extras

    def parse_args(self, argv: Sequence[str] | None = None) -> Any:
        """The command line -> Options (exits 0 after --help/--version, 2 on a bad flag)."""
        return parse_or_exit(self.name, argv, self.load, lambda: self.flag_set().usage(),
                             self.version, self.errors)
