"""nsqx.cli."""
