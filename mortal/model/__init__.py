"""Model: the networks and their files. ``Brain``, ``DQN``, ``AuxNet`` and ``GRP`` with Mortal's parameter names
(``networks``), checkpoints (atomic saves, weights-only loads, shape checks, ``CheckpointError``) and the baseline
files (promotion to the baselines with ``.bak`` copies, the opponent pool, installing a baseline fetched from the
server). Below ``data``, ``play`` and ``learning``, which all load or save models; it knows nothing of training.
"""
