"""Features: the game encoded for the network (tiles, actions, observations v1-4). No model, no I/O."""
