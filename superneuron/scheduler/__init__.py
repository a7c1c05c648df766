"""The memory scheduler: an iteration as a list of steps, passes that rewrite it, and the Simulator."""
