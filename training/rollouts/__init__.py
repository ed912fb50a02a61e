"""Rollouts: episodes played token in, token out by the current policy (HF or vLLM), verdicts judged."""
