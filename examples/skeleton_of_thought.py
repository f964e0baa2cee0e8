"""Skeleton of thought: the model writes a short outline, then every point is expanded in
parallel by a fork, and the expansions are joined back in order.

The branches share the question and the outline, so the runtime prefills them once.

    python -m stemma.examples.skeleton_of_thought [--model smollm2-135m | --url http://HOST:PORT]
"""

from __future__ import annotations

import re
from typing import Any

from stemma.lang import Backend, assistant, function, gen, system, user

from .cli import open_backend, parse_args

NUM_POINTS = 3
TOPICS = [
    "How can a small town reduce traffic?",
    "How should a beginner start running?",
    "Why do some bridges sway in the wind?",
    "How do you keep houseplants alive?",
    "What makes a good team meeting?",
    "How can a library attract teenagers?",
]


def outline_points(skeleton: str, num: int = NUM_POINTS) -> list[str]:
    """The outline's numbered lines without their numbers; generic points fill any missing."""
    lines = [re.sub(r"^\s*(\d+[.)]|[-*])\s*", "", line).strip() for line in skeleton.splitlines()]
    points = [line for line in lines if line][:num]
    return points + [f"aspect {i + 1}" for i in range(len(points), num)]


@function
def skeleton_of_thought(s, question: str, max_tokens: int = 48) -> list[str]:
    s += system("You answer in short, well-organized points.")
    s += user(f"{question}\nWrite only an outline: {NUM_POINTS} numbered points, a few words each.")
    s += assistant(gen("skeleton", max_tokens=12 * NUM_POINTS, temperature=0))
    points = outline_points(s["skeleton"])
    branches = s.fork(NUM_POINTS)
    for branch, point in zip(branches, points, strict=True):
        branch += user(f"Expand the point '{point}' in one or two sentences.")
        branch += assistant(gen("expansion", max_tokens=max_tokens, stop="\n\n", temperature=0))
    branches.join()  # s["expansion"] is the list of expansions, in point order
    return points


def workload(num: int) -> list[dict[str, Any]]:
    return [
        {"question": TOPICS[i % len(TOPICS)] + (f" (take {i})" if i >= len(TOPICS) else "")}
        for i in range(num)
    ]


PROGRAM = skeleton_of_thought


def run_example(backend: Backend, max_tokens: int = 48) -> dict[str, Any]:
    state = skeleton_of_thought.run(question=TOPICS[0], max_tokens=max_tokens, backend=backend)
    return {"points": state.ret_value, "expansions": state["expansion"]}


def main(argv: list[str] | None = None) -> None:
    with open_backend(parse_args(__doc__, argv)) as backend:
        result = run_example(backend)
    print(TOPICS[0])
    for i, (point, text) in enumerate(zip(result["points"], result["expansions"], strict=True)):
        print(f"{i + 1}. {point}\n   {text.strip()}")


if __name__ == "__main__":
    main()
