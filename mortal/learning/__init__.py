"""Learning: the networks and what trains them. Model, loss terms, optimizer and learning-rate schedule,
checkpoints (atomic saves, safe loads, shape checks), the promotion gate and baseline rotation, the training
guards (rollback on divergence) and supervisor, and the diagnostics written to TensorBoard.
"""
