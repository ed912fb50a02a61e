"""The SFT warm start's pieces: collecting accepted trajectories, TRL training, the warm-start cache."""
