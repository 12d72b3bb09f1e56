"""nsqx.protocol."""
