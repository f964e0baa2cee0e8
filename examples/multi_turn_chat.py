"""Multi-turn chat: a persona answers a user's questions turn after turn; each turn's prompt is
the whole conversation so far, so each request is a prefix-cache hit up to its new question.

    python -m stemma.examples.multi_turn_chat [--model smollm2-135m | --url http://HOST:PORT]
"""

from __future__ import annotations

from typing import Any

from stemma.lang import Backend, assistant, function, gen, system, user

from .cli import open_backend, parse_args

PERSONAS = ["a patient gardener", "a ship's navigator", "a museum guide", "a bicycle mechanic"]
TURNS = [
    "Hello! What do you do all day?",
    "What is the hardest part of it?",
    "Tell me one thing most people get wrong about it.",
    "What would you tell a beginner?",
]


@function
def multi_turn_chat(s, persona: str, turns: list[str], max_tokens: int = 40) -> None:
    s += system(f"You are {persona}. Answer in one or two sentences.")
    for i, question in enumerate(turns):
        s += user(question)
        s += assistant(gen(f"reply_{i}", max_tokens=max_tokens, temperature=0))


def workload(num: int) -> list[dict[str, Any]]:
    """`num` conversations: each persona with the questions rotated, then numbered repeats."""
    items = []
    for i in range(num):
        shift = (i // len(PERSONAS)) % len(TURNS)
        persona = PERSONAS[i % len(PERSONAS)]
        if i >= len(PERSONAS) * len(TURNS):
            persona += f" (number {i})"
        items.append({"persona": persona, "turns": TURNS[shift:] + TURNS[:shift]})
    return items


PROGRAM = multi_turn_chat


def run_example(backend: Backend, max_tokens: int = 40) -> list[dict[str, str]]:
    state = multi_turn_chat.run(**workload(1)[0], max_tokens=max_tokens, backend=backend)
    return state.messages()


def main(argv: list[str] | None = None) -> None:
    with open_backend(parse_args(__doc__, argv)) as backend:
        messages = run_example(backend)
    for message in messages:
        print(f"{message['role']}: {message['content']}")


if __name__ == "__main__":
    main()
