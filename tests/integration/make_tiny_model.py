"""Writes a random-initialised Qwen3-shaped model and a byte-level BPE tokenizer into a folder, offline.

Run with the vLLM virtualenv's Python (transformers, tokenizers, torch):

    python make_tiny_model.py OUT_DIR [--seed 0] [--vocabulary WORDS_FILE]

The shape (hidden 512, intermediate 1536, 6 layers, 8 heads, 4 KV heads, head dim 64, vocabulary 2048; ~19M
parameters, bfloat16) makes a CPU step's time depend on its tokens, which the batch-time fit needs. The tokenizer is
trained in memory on generated words, its vocabulary the model's, with an end-of-text token. With --vocabulary (a file
of words, whitespace-separated) it is a word-level one instead: one token per word or punctuation run
(`\w+|[^\w\s]+`, tokenizers' `Whitespace` pre-tokenizer), the file's words each a token of their own and any other
piece an unknown-word token, so that it counts a prompt's tokens exactly as BEAR's `pretokens` tokenizer does.
"""

from __future__ import annotations

import argparse
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config  # noqa: E402

VOCAB = 2048
EOS = "<|endoftext|>"
UNK = "<|unknown|>"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def corpus(rng: random.Random, lines: int = 4000) -> list[str]:
    syllables = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "zu", "an", "el", "or", "is", "um"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) + "." for _ in range(lines)]


def make_tokenizer(rng: random.Random) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(rng), trainer)
    assert tokenizer.get_vocab_size() <= VOCAB, tokenizer.get_vocab_size()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS,
                                   chat_template=CHAT_TEMPLATE)


def make_word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """One token per word or punctuation run; the first VOCAB - 2 distinct `words` known, others unknown."""
    vocabulary = {EOS: 0, UNK: 1}
    for word in words:
        if len(vocabulary) < VOCAB:
            vocabulary.setdefault(word, len(vocabulary))
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS, unk_token=UNK,
                                   chat_template=CHAT_TEMPLATE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocabulary", help="a file of words: a word-level tokenizer knowing them")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    if args.vocabulary:
        with open(args.vocabulary, encoding="utf-8") as file:
            tokenizer = make_word_tokenizer(file.read().split())
    else:
        tokenizer = make_tokenizer(rng)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.eos_token_id, torch_dtype="bfloat16")
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(args.out_dir, safe_serialization=True)
    tokenizer.save_pretrained(args.out_dir)


if __name__ == "__main__":
    main()
