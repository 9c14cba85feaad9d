"""A byte-level tokenizer with a chat template, built offline.

Every byte is one token, so any text round-trips and no merges file is needed. Reserved
tokens pad the vocabulary to the model's size, so every id a random model samples decodes.
"""

from __future__ import annotations

from pathlib import Path

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def save_byte_tokenizer(directory: Path, vocab_size: int) -> None:
    """Write tokenizer.json / tokenizer_config.json for a ``vocab_size`` byte tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_vocab = pre_tokenizers.ByteLevel.alphabet()
    specials = [BOS, EOS, PAD]
    if vocab_size < len(byte_vocab) + len(specials):
        raise ValueError(f"vocab_size must be >= {len(byte_vocab) + len(specials)}")
    vocab = {tok: i for i, tok in enumerate(sorted(byte_vocab))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    reserved = [f"<|reserved_{i}|>" for i in range(vocab_size - len(vocab) - len(specials))]
    tokenizer.add_special_tokens(specials + reserved)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )
    assert len(fast) == vocab_size, (len(fast), vocab_size)
    fast.save_pretrained(directory)
