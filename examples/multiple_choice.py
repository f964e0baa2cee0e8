"""Few-shot multiple choice (the MMLU shape): five worked questions, then a new one answered
by `select` over the option letters.

The system prompt and the five shots are the same for every question, so a batch of questions
prefills them once and every later question is a prefix-cache hit up to its own text.

    python -m stemma.examples.multiple_choice [--model smollm2-135m | --url http://HOST:PORT]
"""

from __future__ import annotations

from typing import Any

from stemma.lang import Backend, assistant, function, select, system

from .cli import open_backend, parse_args

LETTERS = ["A", "B", "C", "D"]
SHOTS = [
    ("Which planet is closest to the Sun?", ["Venus", "Mercury", "Mars", "Earth"], "B"),
    ("What is 6 times 7?", ["42", "36", "48", "49"], "A"),
    (
        "Which gas do plants take in for photosynthesis?",
        ["Oxygen", "Helium", "Nitrogen", "Carbon dioxide"],
        "D",
    ),
    ("How many sides does a hexagon have?", ["Five", "Eight", "Six", "Seven"], "C"),
    ("Which of these is a mammal?", ["Shark", "Dolphin", "Trout", "Octopus"], "B"),
]
FACTS = [
    ("What is the boiling point of water at sea level in Celsius?", ["90", "100", "110", "120"]),
    ("Which organ pumps blood through the body?", ["Lungs", "Liver", "Heart", "Kidney"]),
    ("What is the largest ocean on Earth?", ["Atlantic", "Indian", "Arctic", "Pacific"]),
    ("Which metal is liquid at room temperature?", ["Mercury", "Iron", "Copper", "Tin"]),
]


def format_question(question: str, options: list[str]) -> str:
    lines = [f"Question: {question}"]
    lines += [f"{letter}. {option}" for letter, option in zip(LETTERS, options, strict=True)]
    return "\n".join(lines) + "\nAnswer:"


FEW_SHOT = "".join(f"{format_question(q, opts)} {gold}\n\n" for q, opts, gold in SHOTS)


@function
def multiple_choice(s, question: str, options: list[str]) -> None:
    s += system("Answer each multiple-choice question with the letter of the correct option.")
    with s.user():
        s += FEW_SHOT
        s += format_question(question, options)
    s += assistant(select("answer", choices=LETTERS))


def workload(num: int) -> list[dict[str, Any]]:
    """`num` distinct questions: the shipped facts, then generated arithmetic."""
    items: list[dict[str, Any]] = []
    for i in range(num):
        if i < len(FACTS):
            question, options = FACTS[i]
        else:
            a, b = 3 + i % 17, 4 + (i * 7) % 23
            right = a * b
            options = [str(right + d) for d in ((i % 4) * -1, 1 - i % 4, 2 - i % 4, 3 - i % 4)]
            question = f"What is {a} times {b}?"
        items.append({"question": question, "options": options})
    return items


PROGRAM = multiple_choice


def run_example(backend: Backend, num: int = 6, progress_bar: bool = False) -> list[str]:
    """The chosen letter for each of `num` questions."""
    states = multiple_choice.run_batch(workload(num), backend=backend, progress_bar=progress_bar)
    return [state["answer"] for state in states]


def main(argv: list[str] | None = None) -> None:
    with open_backend(parse_args(__doc__, argv)) as backend:
        answers = run_example(backend, progress_bar=True)
    for item, letter in zip(workload(len(answers)), answers, strict=True):
        option = item["options"][LETTERS.index(letter)]
        print(f"{letter} ({option}) <- {item['question']}")


if __name__ == "__main__":
    main()
