"""mlx_lm.server's prompt cache (`LRUPromptCache`), the same rules as mlxgate-sim's
src/sim/prompt_cache.rs, in Python: the oracle replays the workload through it offline, and the
self-test checks the same hand-made cases as the Rust tests (the two must agree)."""

from __future__ import annotations

KINDS = ("assistant", "user", "system")  # eviction order


def common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class LruPromptCache:
    """At most `capacity` token sequences (None: unbounded), by kind, oldest first."""

    def __init__(self, capacity: int | None):
        self.capacity = capacity
        self.lrus: dict[str, list[list]] = {k: [] for k in KINDS}

    def __len__(self) -> int:
        return sum(len(v) for v in self.lrus.values())

    def entries(self):
        for k in KINDS:
            yield from self.lrus[k]

    def fetch(self, prompt: list) -> int:
        """Tokens of `prompt` served from the cache, as mlx_lm.server reports them."""
        if not prompt:
            return 0
        if any(e == prompt for e in self.entries()):
            return len(prompt)
        shared = max((common_prefix(e, prompt) for e in self.entries()), default=0)
        shorter = max((len(e) for e in self.entries()
                       if 2 <= len(e) < len(prompt) and prompt[:len(e)] == e), default=0)
        return min(shared, len(prompt) - 1) if shared > shorter else shorter

    def insert(self, tokens: list, kind: str = "assistant") -> None:
        for k in KINDS:
            if tokens in self.lrus[k]:
                self.lrus[k].remove(tokens)
                break
        for k in KINDS:
            self.lrus[k] = [e for e in self.lrus[k] if not (len(e) < len(tokens) and tokens[:len(e)] == e)]
        self.lrus[kind].append(tokens)
        if self.capacity is not None and len(self) > self.capacity:
            for a, b in zip(KINDS, KINDS[1:]):
                if self.lrus[a] and len(self.lrus[a]) >= len(self.lrus[b]):
                    self.lrus[a].pop(0)
                    return
            self.lrus["system"].pop(0)
