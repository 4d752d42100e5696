#!/usr/bin/env python3
"""Generate a tiny Qwen3-style model that real MLX servers load on a Linux CPU.

    python scripts/make-tiny-model.py DIR [--hidden-size 64] [--layers 2] [--intermediate-size 128]
                                          [--heads 4] [--kv-heads 2] [--dtype float32]

Random weights built with mlx_lm.models.qwen3 (by default 2 layers, hidden size 64, float32), a
byte-level BPE tokenizer trained with `tokenizers` on generated text, and a ChatML chat template
in tokenizer_config.json. Needs a Python with mlx and mlx-lm (e.g. .venv-mlx-lm). No download.
Deterministic: the same seed and sizes give the same files.

The size options make bigger random models for benchmarks (bench/servers: one large enough that
decoding is memory-bound, so that batching two requests shows). The head size is
hidden size / heads unless --head-dim says otherwise.
"""
import argparse
import json
import os
import random
import sys

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus(seed):
    rng = random.Random(seed)
    words = ("the a model token stream server gateway queue request answer fast slow apple metal "
             "memory cache prompt context user system assistant hello world code test run time "
             "first last value error retry swap load ready speed batch mac local python rust").split()
    for _ in range(4000):
        yield " ".join(rng.choice(words) for _ in range(rng.randint(4, 16))) + "."


def printable_alphabet():
    """The byte-level characters of tab, newline and the printable ASCII bytes."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    text = "\t\n" + "".join(chr(b) for b in range(0x20, 0x7F))
    return sorted({piece for piece, _ in byte_level.pre_tokenize_str(text) for piece in piece})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=128)
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (grouped-query attention)")
    p.add_argument("--head-dim", type=int, default=None, help="default: hidden size / heads")
    p.add_argument("--printable", action="store_true",
                   help="an alphabet of printable ASCII, tab and newline only: no token decodes to a "
                        "broken UTF-8 byte, which a server holds back until the stream ends")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="the weights' type on disk")
    args = p.parse_args()
    head_dim = args.head_dim or args.hidden_size // args.heads
    if args.heads % args.kv_heads:
        p.error(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    os.makedirs(args.dir, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=printable_alphabet() if args.printable else pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(args.seed), trainer=trainer)
    tok.save(os.path.join(args.dir, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    eos_id = tok.token_to_id("<|im_end|>")

    with open(os.path.join(args.dir, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "additional_special_tokens": SPECIAL,
            "model_max_length": 2048,
            "chat_template": CHATML,
            "clean_up_tokenization_spaces": False,
        }, f, indent=2)
    with open(os.path.join(args.dir, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f, indent=2)

    config = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.layers,
        "intermediate_size": args.intermediate_size,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "eos_token_id": eos_id,
        "torch_dtype": args.dtype,
    }
    mx.random.seed(args.seed)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    if args.dtype != "float32":
        model.set_dtype(getattr(mx, args.dtype))
    mx.eval(model.parameters())
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(os.path.join(args.dir, "model.safetensors"), weights, metadata={"format": "mlx"})
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos_id}, f)
    print(f"tiny model in {args.dir}: vocab {vocab}, "
          f"{sum(v.size for v in weights.values())} parameters", file=sys.stderr)


if __name__ == "__main__":
    main()
