"""nsqx.protocol: NSQ's wire protocols, sans-IO (bytes in, commands/frames out; no sockets).

Modules: ``errors`` (ProtocolError with upstream codes/texts), ``names`` (topic/channel
rules), ``frames`` (server->client frames, message records), ``v2`` (nsqd TCP protocol:
CommandParser, validators, client encoders), ``compress`` (snappy framing, raw deflate),
``lookup_v1`` (nsqd <-> nsqlookupd TCP protocol), ``routes`` (key -> partition hashing and
ordered topics' route history, shared by producers, nsqd and the cluster), ``barrier``
(the consumer barrier of ordered topics whose routes change, kept by nsqd and the cluster).
"""
