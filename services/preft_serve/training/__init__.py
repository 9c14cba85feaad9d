"""Training adapters with the semantics they are served with (``preft train``).

PreFT (mode ``prefill``) trains the adapter on prompt tokens only: the response is scored
with the adapter off, seeing it only through the prompt's keys and values, exactly as the
worker decodes. See docs/training.md.
"""
