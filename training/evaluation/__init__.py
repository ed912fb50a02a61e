"""Evaluation and reports: greedy evaluations, their statistics and comparisons, answer sources, curves."""
