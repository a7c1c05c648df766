"""Training: the Trainer (iterations, tests, progress, logs), solver settings, optimisers and
learning-rate policies, snapshots and resume."""
