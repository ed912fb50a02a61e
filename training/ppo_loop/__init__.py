"""The PPO loop's set-up, its no-grad scoring passes and its batches (training/ppo.py runs them)."""
