"""nsqx.nsqd."""
