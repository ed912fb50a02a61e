"""The PPO update's math: advantages, policy losses, KL estimators, controllers and early stop, DAPO, answer credit."""
