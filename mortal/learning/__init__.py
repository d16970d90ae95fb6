"""Learning: what trains the networks. Loss terms, optimizer and learning-rate schedule, the trainer's checkpoint
(resume and save) and its server traffic (parameters out, played logs in), the promotion gate, the training guards
(test play, rollback on divergence, baseline sync) and supervisor, and the diagnostics written to TensorBoard.
The networks and their files live below, in ``mortal.model``; this package sits above ``data`` and ``play``.
"""
