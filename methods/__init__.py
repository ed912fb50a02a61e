"""methods package of seeds-rl."""
