"""``nsqd --workers=N``: one nsqd, N worker processes behind its ports (issue 32, first step).

``supervisor`` binds the node's listening sockets once and runs the workers on them;
``ownership`` says which worker owns a topic and moves the metadata when N changes;
``runtime`` is a worker's side: its internal sockets, publishes forwarded to the owner,
SUB connections handed over, lookupd through worker 0; ``http_routing`` sends HTTP
requests to the owner and merges /stats and /metrics. See docs/design-notes.md.
"""
