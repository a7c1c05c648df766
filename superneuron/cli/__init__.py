"""Command-line tools: sn-train, sn-plan, sn-depth, sn-convert, sn-make-lmdb. Thin: parse, call, print."""
