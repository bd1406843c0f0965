"""A byte-level tokenizer for the tiny and lab models: no download, any text round-trips."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MASK)

# ChatML, as the Qwen family uses.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens (ids 0-255) followed by the special tokens (256-259)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = pre_tokenizers.ByteLevel(add_prefix_space=False)
    # Order the alphabet by byte value so token id == byte value.
    ordered = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(ordered)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = byte_to_char
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        mask_token=MASK,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def _byte_of(ch: str) -> int:
    # GPT-2's byte-to-unicode map: printable bytes map to themselves, the rest to 256 + n.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping = {}
    n = 0
    for b in range(256):
        if b in printable:
            mapping[chr(b)] = b
        else:
            mapping[chr(256 + n)] = b
            n += 1
    return mapping[ch]


def save_byte_tokenizer(out_dir: str | Path) -> PreTrainedTokenizerFast:
    tok = build_byte_tokenizer()
    tok.save_pretrained(str(out_dir))
    return tok
