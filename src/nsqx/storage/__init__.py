"""nsqx.storage."""
