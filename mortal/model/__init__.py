"""Model: the networks, checkpoint files and baseline files; below ``data``, ``play`` and ``learning``."""
