"""Model: the networks (Mortal's parameter names), checkpoint files and baseline files. Below ``data``,
``play`` and ``learning``; it knows nothing of training."""
