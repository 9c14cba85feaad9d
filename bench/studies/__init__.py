"""Research studies, not benchmarks: what PreFT adapters learn against all-token adapters,
by supervised fine-tuning (``make bench-quality``) and by RL (``make bench-rl``); whether the
decode pool's KV is the prefill worker's to float precision (``kv_fidelity``)."""
