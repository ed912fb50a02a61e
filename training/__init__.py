"""training package of seeds-rl."""
