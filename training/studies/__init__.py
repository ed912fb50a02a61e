"""Research studies: what reading rules can get (reader study) and what the verdicts know (verdict signal)."""
