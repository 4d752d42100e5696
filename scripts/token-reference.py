#!/usr/bin/env python3
"""Reference prompt renderings and token counts from transformers, for tests/it/tokens_reference.rs.

usage: token-reference.py TOKENIZER_DIR CORPUS_JSON [--template FILE]

CORPUS_JSON holds {"chats": [{"name", "messages", "tools"?, "chat_template_kwargs"?}],
"texts": [{"name", "text", "repeat"?}]} (a text is its text repeated). Prints JSON: per chat, the rendered text
(apply_chat_template(..., tokenize=False, add_generation_prompt=True, tools=...)) and the token
count (tokenize=True), or the error the template raised; per text, len(tokenizer(text).input_ids).
--template FILE renders with that chat template instead of the model's.
"""

import argparse
import copy
import json
import sys

from transformers import AutoTokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tokenizer_dir")
    parser.add_argument("corpus")
    parser.add_argument("--template")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    if args.template:
        with open(args.template, encoding="utf-8") as f:
            tokenizer.chat_template = f.read()
    with open(args.corpus, encoding="utf-8") as f:
        corpus = json.load(f)

    chats = []
    for entry in corpus["chats"]:
        kwargs = dict(entry.get("chat_template_kwargs") or {})
        tools = entry.get("tools")

        def apply(tokenize: bool):
            return tokenizer.apply_chat_template(
                copy.deepcopy(entry["messages"]),
                tools=copy.deepcopy(tools),
                tokenize=tokenize,
                add_generation_prompt=True,
                **kwargs,
            )

        try:
            text = apply(False)
            ids = apply(True)
            if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
            chats.append({"name": entry["name"], "text": text, "tokens": len(ids)})
        except Exception as e:  # the template raised: the Rust side must fail too
            chats.append({"name": entry["name"], "error": f"{type(e).__name__}: {e}"})

    texts = [
        {"name": entry["name"], "tokens": len(tokenizer(entry["text"] * entry.get("repeat", 1)).input_ids)}
        for entry in corpus["texts"]
    ]
    json.dump({"chats": chats, "texts": texts}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
