"""The warm start's teachers (scripted, or a prompted method) and the SEEDS-R1 trajectories they write."""
