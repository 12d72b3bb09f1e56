"""The upstream NSQ utilities, same names and flags: ``nsq_tail``, ``to_nsq``,
``nsq_to_file``, ``nsq_to_http``, ``nsq_to_nsq``, ``nsq_stat``.

Each is ``python -m nsqx.tools.<name>`` (and a console script of that name). They use only
public APIs: :mod:`nsqx.client` and the HTTP APIs of nsqd and nsqlookupd.
"""
