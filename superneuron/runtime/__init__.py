"""The runtime: the arena that owns device memory, and the executor that runs a schedule on it."""
