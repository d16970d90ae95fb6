"""Mortal-style online reinforcement-learning trainer for Riichi Mahjong.

One module per concern; the three long-running processes are ``server.py``,
``client.py`` and ``train.py``. No module reads the config or starts work at
import time: each process loads the config once in ``main()`` and passes it down.
"""

__version__ = "0.1.0"
