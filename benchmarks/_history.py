"""One synthetic conversation, the same for every system that stores it.

A history of ``n`` messages is turns of one user message followed by several assistant
messages (a tool-using agent's steps), with realistic, deterministic sizes: user messages
of 100–600 characters, assistant messages of 200–2,000. Every system under comparison
stores exactly these texts, each in its own native shape.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["ASSISTANT_PER_TURN", "Message", "history"]

ASSISTANT_PER_TURN = 4
"""Assistant messages (model steps) after each user message."""

_SENTENCE = (
    "the child agent reads repository files and summarises what changed in each module "
    "before it proposes a patch; tests pass except one flaky timeout in the store suite, "
    "so it reruns them with a larger budget and reports the diff, the failing trace, "
    "a plan for the migration and three open questions about ownership of the schema"
)
_WORDS = tuple(_SENTENCE.split())


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the conversation."""

    role: str  # "user" or "assistant"
    text: str


@lru_cache(maxsize=8)
def history(n: int, seed: int = 7) -> tuple[Message, ...]:
    """``n`` messages: a user message, then `ASSISTANT_PER_TURN` assistant ones, repeated."""
    rng = random.Random(seed + n)
    out = []
    for i in range(n):
        user = i % (ASSISTANT_PER_TURN + 1) == 0
        size = rng.randint(100, 600) if user else rng.randint(200, 2000)
        out.append(Message("user" if user else "assistant", _text(rng, size)))
    return tuple(out)


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]
