"""ReAct agent (reason, act, observe): each step the model thinks, picks an action with `select`,
writes the action's input, and reads the tool's observation, until it picks `finish`.

The tools are a lookup over a small shipped knowledge base of made-up towns and a calculator.
Every step's prompt extends the last one, so each request is a prefix-cache hit up to its
new observation.

    python -m stemma.examples.react_agent [--model smollm2-135m | --url http://HOST:PORT]
"""

from __future__ import annotations

from typing import Any

from stemma.lang import Backend, assistant, function, gen, select, system, user

from .cli import open_backend, parse_args
from .tool_call_agent import calculator

TOWNS = {
    "brindle": "Brindle has 4200 inhabitants and lies on the river Oss.",
    "carrow": "Carrow has 1300 inhabitants and is known for its glass works.",
    "dunmere": "Dunmere has 8800 inhabitants and an old stone bridge.",
    "elsby": "Elsby has 650 inhabitants and a lighthouse.",
}
ACTIONS = ["lookup", "calculate", "finish"]
SYSTEM = (
    "You answer questions by using tools, one step at a time.\n"
    "Tools: lookup (facts about a town, input: the town's name), "
    "calculate (arithmetic, input: an expression such as 4200 + 1300), "
    "finish (give the final answer).\n"
    "Each step: say what you need in one sentence, choose a tool, give its input."
)


def run_tool(action: str, argument: str) -> str:
    if action == "lookup":
        return TOWNS.get(argument.strip(" .'\"").lower(), f"no entry for {argument.strip()!r}")
    try:
        return calculator(argument.strip())
    except (ValueError, SyntaxError, ZeroDivisionError) as err:
        return f"error: {err}"


@function
def react_agent(s, question: str, max_steps: int = 3, max_tokens: int = 32) -> list[str]:
    s += system(SYSTEM)
    s += user(f"Question: {question}\nWhat do you need first?")
    actions: list[str] = []
    for step in range(max_steps):
        s += assistant(gen(f"thought_{step}", max_tokens=max_tokens, stop="\n", temperature=0))
        s += user("Which tool now: lookup, calculate or finish?")
        s += assistant(select(f"action_{step}", choices=ACTIONS))
        action = s[f"action_{step}"]
        actions.append(action)
        if action == "finish":
            break
        s += user(f"Input for {action}:")
        s += assistant(gen(f"input_{step}", max_tokens=16, stop="\n", temperature=0))
        observation = run_tool(action, s[f"input_{step}"])
        s += user(f"Observation: {observation}\nWhat next?")
    s += user("Give the final answer in one sentence.")
    s += assistant(gen("answer", max_tokens=max_tokens, stop="\n", temperature=0))
    return actions


def workload(num: int) -> list[dict[str, Any]]:
    """`num` questions over pairs of towns, each needing lookups and then arithmetic."""
    names = [name.capitalize() for name in TOWNS]
    pairs = [(a, b) for a in names for b in names if a != b]
    templates = ["How many people live in {} and {} together?", "How many more live in {} than {}?"]
    questions = [templates[i % 2].format(*pairs[(i // 2) % len(pairs)]) for i in range(num)]
    return [
        {"question": q + (f" (case {i})" if i >= 2 * len(pairs) else "")}
        for i, q in enumerate(questions)
    ]


PROGRAM = react_agent


def run_example(backend: Backend, max_tokens: int = 32) -> dict[str, Any]:
    question = workload(1)[0]["question"]
    state = react_agent.run(question=question, max_tokens=max_tokens, backend=backend)
    return {"question": question, "actions": state.ret_value, "answer": state["answer"]}


def main(argv: list[str] | None = None) -> None:
    with open_backend(parse_args(__doc__, argv)) as backend:
        result = run_example(backend)
    print(f"question: {result['question']}")
    print(f"actions: {' -> '.join(result['actions'])}")
    print(f"answer: {result['answer']}")


if __name__ == "__main__":
    main()
