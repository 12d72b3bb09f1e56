"""nsqx: NSQ's protocols on a durable, partitioned log."""

# The one place the version is written: pyproject.toml reads it from here (setuptools'
# dynamic version). Not importlib.metadata at run time: importing it costs ~70 ms of every
# program's start (issue 24 asks nsqd to answer /ping within 0.15 s of its spawn).
__version__ = "0.1.0"
# The NSQ version we speak; stock clients read it from IDENTIFY and /info.
NSQ_VERSION = "1.3.0"
