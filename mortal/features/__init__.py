"""Features: the encoding of the game for the network. The mjai event vocabulary, tiles and action ids, the
observation tensors of each feature version (``obs`` for versions 1-3, ``obs_v4`` with the single-player search of
``sp``, which runs on a compiled C++ core). Pure functions of game state; no model, no I/O.
"""
