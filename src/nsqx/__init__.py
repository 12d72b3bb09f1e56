"""nsqx: NSQ's protocols on a durable, partitioned log."""

__version__ = "0.1.0"
# The NSQ version we speak; stock clients read it from IDENTIFY and /info.
NSQ_VERSION = "1.3.0"
