"""Offline importers into nsqx's data path (``nsqx import``); only the cli imports this."""
