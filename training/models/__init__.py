"""The models PPO trains: actor, critic and reference, the frozen layers below LoRA, checkpoints."""
