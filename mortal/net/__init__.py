"""Networking: the wire protocol between server, clients and trainer (length-prefixed msgpack frames, state dicts
as safetensors bytes, the ``Remote`` client of the server) and the loopback rule that decides when a token is
required; the server's replay store (``replay_store``) and its TCP front (``param_server``), which
``mortal/server.py`` runs. Used by all three long-running processes; it knows nothing of training.
"""
