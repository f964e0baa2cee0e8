"""Branch-solve-merge LLM judge: two answers to a question are judged on each criterion in its
own branch (a short rationale, then a verdict by `select`), and the verdicts are merged into
one final verdict.

Every branch shares the question and both answers; only the criterion differs.

    python -m stemma.examples.llm_judge [--model smollm2-135m | --url http://HOST:PORT]
"""

from __future__ import annotations

from typing import Any

from stemma.lang import Backend, assistant, function, gen, select, system, user

from .cli import open_backend, parse_args

CRITERIA = ["correctness", "helpfulness", "clarity"]
PAIRS = [
    (
        "Why is the sky blue?",
        "Air scatters blue sunlight more than red light, so blue reaches us from all over.",
        "Because the ocean reflects onto it.",
    ),
    (
        "How do I boil an egg?",
        "Put it in boiling water for 7 to 9 minutes, then cool it in cold water.",
        "Heat it.",
    ),
    (
        "What does a thermometer measure?",
        "How hot it is.",
        "Temperature: how hot or cold something is, read on a scale such as Celsius.",
    ),
    (
        "Why do we have seasons?",
        "Earth's axis is tilted, so each half gets more direct sunlight for part of the year.",
        "Earth is closer to the Sun in summer.",
    ),
]


@function
def llm_judge(s, question: str, answer_a: str, answer_b: str, max_tokens: int = 40) -> None:
    s += system("You are a fair judge of answers. Be brief.")
    s += user(f"Question: {question}\nAnswer A: {answer_a}\nAnswer B: {answer_b}")
    branches = s.fork(len(CRITERIA))
    for branch, criterion in zip(branches, CRITERIA, strict=True):  # solve
        branch += user(f"Judge only the {criterion} of the two answers, in one sentence.")
        branch += assistant(gen("rationale", max_tokens=max_tokens, stop="\n", temperature=0))
        branch += user(f"Which answer has better {criterion}? Reply A or B.")
        branch += assistant(select("verdict", choices=["A", "B"]))
    branches.join()  # merge: s["verdict"] and s["rationale"] are lists, one per criterion
    summary = "\n".join(
        f"{c}: {v} ({r.strip()})" for c, v, r in zip(CRITERIA, s["verdict"], s["rationale"])
    )
    s += user(f"Your verdicts:\n{summary}\nWhich answer is better overall? Reply A or B.")
    s += assistant(select("overall", choices=["A", "B"]))


def workload(num: int) -> list[dict[str, Any]]:
    """`num` judgements: the shipped pairs, in both orders, then numbered repeats."""
    items = []
    for i in range(num):
        question, first, second = PAIRS[(i // 2) % len(PAIRS)]
        a, b = (first, second) if i % 2 == 0 else (second, first)
        suffix = f" (case {i})" if i >= 2 * len(PAIRS) else ""
        items.append({"question": question + suffix, "answer_a": a, "answer_b": b})
    return items


PROGRAM = llm_judge


def run_example(backend: Backend, max_tokens: int = 40) -> dict[str, Any]:
    state = llm_judge.run(**workload(1)[0], max_tokens=max_tokens, backend=backend)
    return {"verdicts": state["verdict"], "overall": state["overall"]}


def main(argv: list[str] | None = None) -> None:
    with open_backend(parse_args(__doc__, argv)) as backend:
        result = run_example(backend)
    for criterion, verdict in zip(CRITERIA, result["verdicts"], strict=True):
        print(f"{criterion}: {verdict}")
    print(f"overall: {result['overall']}")


if __name__ == "__main__":
    main()
