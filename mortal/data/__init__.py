"""Training data: reading mjai logs, replaying them into (observation, action, mask) samples, the GRP rank
predictor and the rewards it gives, the DataLoader over log files (offline and online buffers), and the claims
ledger that hands buffered logs to the trainer exactly once.
"""
