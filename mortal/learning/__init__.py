"""Learning: loss, optimizer and schedule, the trainer's checkpoint and server traffic, gate, guards, supervisor
and diagnostics. Sits above ``data``, ``play`` and ``model``."""
