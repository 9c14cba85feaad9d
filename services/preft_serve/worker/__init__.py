"""The worker: vLLM's own OpenAI server extended through the ``preft`` plugin."""
