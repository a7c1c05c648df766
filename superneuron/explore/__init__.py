"""What the tools find by planning alone: the deepest ResNet that fits a budget (depth.py, its
search in depth_search.py: sn-depth) and each policy's time against the budget (tradeoff.py:
sn-plan --tradeoff)."""
