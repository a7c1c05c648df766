"""Command-line tools: sn-train (and later sn-plan, sn-depth). Thin: parse, wire, print."""
