"""How long a worker waits for another (``nsqd --workers``): a worker that is down is
restarting, so a forwarded publish or proxied request is tried again until then."""

FORWARD_TIMEOUT = 10.0  # a publish / request for a worker that is down waits this long
RETRY_FIRST, RETRY_CAP = 0.02, 0.5  # pauses between attempts, doubled up to the cap
