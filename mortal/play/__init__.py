"""Playing games: the engine that turns observations into actions with a model, the agents and players that run
self-play and evaluation games through riichienv, the arena and evaluation helpers that pit checkpoints against
each other, and the duplicate 1v3 scoring they report with. Produces the mjai logs that the data package reads.
"""
