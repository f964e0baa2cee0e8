"""Branching agent: state the goal, explore three approaches in parallel, score each with
select, then expand the best one into steps.

    python -m stemma.examples.branching_agent [--model smollm2-135m | --url http://HOST:PORT]
"""

from __future__ import annotations

from typing import Any

from stemma.lang import Backend, assistant, function, gen, select, system, user

from .cli import open_backend, parse_args

TASK = "Organize a small community book swap."
SCORES = ["1", "2", "3", "4", "5"]


@function
def branching_agent(s, task: str) -> dict[str, Any]:
    s += system("You are a concise, practical planner.")
    s += user(f"Task: {task}\nState the goal in one sentence.")
    s += assistant(gen("goal", max_tokens=40, stop="\n"))

    # Three branches share the conversation so far; the runtime caches it once.
    branches = s.fork(3)
    for i, branch in enumerate(branches):
        branch += user(f"Suggest approach number {i + 1} in one sentence.")
        branch += assistant(gen("approach", max_tokens=48, temperature=0.8, stop="\n"))
        branch += user("Rate this approach from 1 (poor) to 5 (excellent) with one digit.")
        branch += assistant(select("score", choices=SCORES))

    scores = [int(branch["score"]) for branch in branches]
    best = scores.index(max(scores))
    s += user(f"Expand this approach into three short steps: {branches[best]['approach']}")
    s += assistant(gen("steps", max_tokens=128))
    return {"approaches": [b["approach"] for b in branches], "scores": scores, "best": best}


def run_example(backend: Backend) -> dict[str, Any]:
    state = branching_agent.run(task=TASK, backend=backend)
    return {"goal": state["goal"], **state.ret_value, "steps": state["steps"]}


def main(argv: list[str] | None = None) -> None:
    with open_backend(parse_args(__doc__, argv)) as backend:
        result = run_example(backend)
    print(f"goal: {result['goal']}")
    for i, (approach, score) in enumerate(zip(result["approaches"], result["scores"], strict=True)):
        marker = "*" if i == result["best"] else " "
        print(f"{marker} approach {i + 1} (score {score}): {approach}")
    print(f"steps:\n{result['steps']}")


if __name__ == "__main__":
    main()
