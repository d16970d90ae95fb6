"""Learning: loss, optimizer and schedule, the trainer's intake and server traffic, distributed training, gate,
guards, supervisor and diagnostics. Sits above ``data``, ``play`` and ``model``."""
