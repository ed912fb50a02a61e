"""inference package of seeds-rl."""
