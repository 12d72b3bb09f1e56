"""Test support: real nsqd processes, TLS material, an auth server, HTTP helpers, client runners."""
