"""Training data: mjai logs -> samples, the GRP, the DataLoader and the claim ledger."""
