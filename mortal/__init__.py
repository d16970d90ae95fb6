"""Mortal-style online reinforcement-learning trainer for Riichi Mahjong. No module reads the config or starts work
at import time: each process (``server.py``, ``client.py``, ``train.py``) loads it once in ``main()``; passes it on."""

__version__ = "0.1.0"
