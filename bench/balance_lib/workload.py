"""The fixed workload of bench/balance: agent sessions shaped like a coding agent's, generated
from a seed and checked in with its output (`workload.json` beside this file).

    python3 bench/balance_lib/workload.py           # rewrite workload.json (same seed: same bytes)
    python3 bench/balance_lib/workload.py --check   # exit 1 when workload.json differs from the generator's

It was fixed BEFORE any routing policy was tuned (issue 21): change the seed or the shape only
with a new file name, never to suit a policy.

Shape: 7 conversations (an odd number, so that round robin over two backends cannot pin them by
parity), 11 to 14 turns each, from 3 clients; every conversation starts with the same system
prompt and offers the same tools (as Claude Code does); each turn appends the previous turn's
assistant answer (the recorded one, not the one the server generates: a replay of recorded
sessions, so that every policy sees the same prompts) and a new message: a tool result of varied,
heavy-tailed size (most short, some long outputs) or, now and then, a new user instruction.
A conversation's next turn is sent after its previous answer, after a short "tool time".

Text is made of the words the tiny generated model's tokenizer learnt (scripts/make-tiny-model.py's
corpus), each one token there, so that a word of the simulator (its token) is a token of the real
server too, plus ChatML's few tokens per message. The last prompt of a conversation stays under
MAX_PROMPT_WORDS so that it fits the tiny models' 2048-token context with the template's tokens.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

SEED = 21
CONVERSATIONS = 7
CLIENTS = ["alice", "bob", "carol"]
MIN_TURNS, MAX_TURNS = 11, 14
SYSTEM_WORDS = 260
MAX_PROMPT_WORDS = 1480  # measured: ~1.19 tokens a word with the template: under ~1800 tokens
OUT = Path(__file__).resolve().parent / "workload.json"

# scripts/make-tiny-model.py's corpus: one token each in the tiny model's tokenizer.
WORDS = ("the a model token stream server gateway queue request answer fast slow apple metal "
         "memory cache prompt context user system assistant hello world code test run time "
         "first last value error retry swap load ready speed batch mac local python rust").split()

TOOLS = [
    ("bash", "run a command in the local shell and answer with what it printed"),
    ("read", "read a file of the code and answer with its lines"),
    ("edit", "replace a value in a file of the code"),
    ("grep", "search the code for a token and answer with the lines that match"),
]


def words(rng: random.Random, n: int) -> str:
    """n words, a sentence end now and then."""
    out = []
    for i in range(n):
        out.append(rng.choice(WORDS))
        if i % 11 == 10 and i + 1 < n:
            out[-1] += "."
    return " ".join(out)


def tool_definitions(rng: random.Random) -> list[dict]:
    return [{"type": "function", "function": {
        "name": name, "description": f"{what}. {words(rng, 24)}",
        "parameters": {"type": "object", "properties": {
            "value": {"type": "string", "description": words(rng, 8)}}, "required": ["value"]}}}
        for name, what in TOOLS]


def result_size(rng: random.Random) -> int:
    """A tool result's words: mostly short, some long (a file, a test log)."""
    r = rng.random()
    if r < 0.55:
        return rng.randint(12, 50)
    if r < 0.85:
        return rng.randint(50, 120)
    return rng.randint(120, 220)


def conversation(rng: random.Random, index: int, system_words: int) -> dict:
    turns_wanted = rng.randint(MIN_TURNS, MAX_TURNS)
    total = system_words
    first = words(rng, rng.randint(20, 60))
    total += len(first.split())
    turns = [{"append": [{"role": "user", "content": first}], "tool_seconds": 0.0}]
    while len(turns) < turns_wanted:
        left = MAX_PROMPT_WORDS - total
        answer_n = rng.randint(10, 45)
        if rng.random() < 0.2:
            kind, message_n = "user", rng.randint(8, 40)
        else:
            kind, message_n = "tool", result_size(rng)
        # Keep room for the turns still to come (at least 20 words each).
        room = left - answer_n - 20 * (turns_wanted - len(turns) - 1)
        message_n = max(4, min(message_n, room))
        tool = rng.choice(TOOLS)[0]
        answer = f"{words(rng, answer_n)}"
        if kind == "tool":
            message = f"{tool} {words(rng, message_n - 1)}"
        else:
            message = words(rng, message_n)
        turns.append({"append": [{"role": "assistant", "content": answer}, {"role": "user", "content": message}],
                      "tool_seconds": round(rng.uniform(0.1, 0.9), 2) if kind == "tool" else
                      round(rng.uniform(0.5, 1.5), 2)})
        total += len(answer.split()) + len(message.split())
    return {"id": f"c{index}", "client": CLIENTS[index % len(CLIENTS)], "session": f"session-c{index}",
            "start_seconds": round(index * 0.6, 2), "turns": turns}


def generate(seed: int = SEED) -> dict:
    rng = random.Random(seed)
    system = "You are a coding assistant. " + words(rng, SYSTEM_WORDS - 5)
    tools = tool_definitions(rng)
    convs = [conversation(rng, i, len(system.split())) for i in range(CONVERSATIONS)]
    return {
        "about": "bench/balance's fixed workload; generated by bench/balance_lib/workload.py (do not edit)",
        "seed": seed, "system": system, "tools": tools, "clients": CLIENTS, "conversations": convs,
    }


def prompts(workload: dict, conv: dict) -> list[list[dict]]:
    """The messages of each turn's request of one conversation, in order."""
    messages = [{"role": "system", "content": workload["system"]}]
    out = []
    for turn in conv["turns"]:
        messages = messages + turn["append"]
        out.append(messages)
    return out


def words_of(messages: list[dict]) -> list[str]:
    """A prompt's tokens as mlxgate-sim counts them: the whitespace-separated words of each
    message's content, in order."""
    return [w for m in messages for w in (m.get("content") or "").split()]


def render(workload: dict) -> str:
    return json.dumps(workload, indent=1) + "\n"


def load(path: Path = OUT) -> dict:
    return json.loads(path.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the checked-in file instead of writing it")
    args = ap.parse_args()
    text = render(generate())
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print("workload.json matches the generator" if same else "workload.json differs from the generator")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
