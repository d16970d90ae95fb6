"""Networking: the wire protocol between server, clients and trainer, the loopback rule for tokens, and the
server's replay store and TCP front. Knows nothing of training."""
