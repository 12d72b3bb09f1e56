"""nsqx: NSQ's protocols on a durable, partitioned log."""

from importlib.metadata import PackageNotFoundError, version

try:  # the installed distribution's version: one source of truth, pyproject.toml
    __version__ = version("nsqx")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
del PackageNotFoundError, version
# The NSQ version we speak; stock clients read it from IDENTIFY and /info.
NSQ_VERSION = "1.3.0"
