"""One router per file: completions, models, ops (health + metrics)."""
