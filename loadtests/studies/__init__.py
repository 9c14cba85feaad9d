"""Research studies, not benchmarks: what PreFT adapters learn against all-token adapters,
by supervised fine-tuning (``make bench-quality``) and by RL (``make bench-rl``)."""
