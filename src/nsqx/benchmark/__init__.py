"""Load generators and measurements for NSQ-compatible servers (`nsqx bench`, bench/)."""
