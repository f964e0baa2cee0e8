"""Tree of thought with nested forks: first steps in several directions, each continued in
several ways, every leaf judged with `select`, and the best line of thought finished.

A fork's branches share their parent's text, and a branch's own fork shares that again, so
the runtime prefills each level once and every leaf is a prefix-cache hit.

    python -m stemma.examples.tree_of_thought [--model smollm2-135m | --url http://HOST:PORT]
"""

from __future__ import annotations

from typing import Any

from stemma.lang import Backend, assistant, function, gen, select, system, user

from .cli import open_backend, parse_args

STRATEGIES = ["work backwards from the goal", "split it into smaller parts", "estimate first"]
FOLLOW_UPS = ["Check it with numbers.", "Look for a simpler way."]
PUZZLES = [
    "A farmer has 17 sheep and buys 8 more, then sells half. How many are left?",
    "A train leaves at 9:40 and the trip takes 95 minutes. When does it arrive?",
    "Three friends share 45 apples so that each gets 5 more than the last. How many each?",
    "A tank fills in 6 hours and drains in 9. How long to fill it with the drain open?",
]


@function
def tree_of_thought(s, problem: str, width: int = 2, max_tokens: int = 40) -> str:
    s += system("You solve problems by exploring several lines of thought.")
    s += user(f"Problem: {problem}")
    leaves = []
    first = s.fork(width)
    for i, branch in enumerate(first):
        branch += user(f"Propose a first step; {STRATEGIES[i % len(STRATEGIES)]}.")
        branch += assistant(gen("step", max_tokens=max_tokens, stop="\n", temperature=0))
        second = branch.fork(width)  # nested: shares the problem and this first step
        for j, leaf in enumerate(second):
            leaf += user(f"Continue with the next step. {FOLLOW_UPS[j % len(FOLLOW_UPS)]}")
            leaf += assistant(gen("step", max_tokens=max_tokens, stop="\n", temperature=0))
            leaf += user("Does this line of thought lead to the answer? Reply yes or no.")
            leaf += assistant(select("promising", choices=["yes", "no"]))
            leaves.append((branch, leaf))
    # The first leaf judged promising, else the first leaf.
    i = next((k for k, (_, leaf) in enumerate(leaves) if leaf["promising"] == "yes"), 0)
    branch, leaf = leaves[i]
    s += user(f"Use this reasoning: {branch['step']} {leaf['step']}\nGive the final answer.")
    s += assistant(gen("answer", max_tokens=max_tokens, stop="\n", temperature=0))
    return f"leaf {i}"


def workload(num: int) -> list[dict[str, Any]]:
    """`num` problems: the shipped puzzles, then numbered variants of them."""
    return [
        {"problem": PUZZLES[i % len(PUZZLES)] + (f" (case {i})" if i >= len(PUZZLES) else "")}
        for i in range(num)
    ]


PROGRAM = tree_of_thought


def run_example(backend: Backend, max_tokens: int = 40) -> dict[str, Any]:
    problem = PUZZLES[0]
    state = tree_of_thought.run(problem=problem, max_tokens=max_tokens, backend=backend)
    return {"problem": problem, "chosen": state.ret_value, "answer": state["answer"]}


def main(argv: list[str] | None = None) -> None:
    with open_backend(parse_args(__doc__, argv)) as backend:
        result = run_example(backend)
    print(f"problem: {result['problem']}\nchosen: {result['chosen']}\nanswer: {result['answer']}")


if __name__ == "__main__":
    main()
