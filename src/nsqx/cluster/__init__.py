"""Cluster mode: etcd metadata, coordinator election, replication, placement.

Layer: above storage/protocol/client, beside the servers it drives through narrow
interfaces; nsqd itself does not learn etcd.
"""
