"""Few-shot sentiment classification: select over a batch of reviews, with a progress bar.

The few-shot examples form a constant prefix: run_batch traces it and prefills it once, so
every review after that is a prefix-cache hit.

    python -m stemma.examples.few_shot_classify [--model smollm2-135m | --url http://HOST:PORT]
"""

from __future__ import annotations

from stemma.lang import Backend, assistant, function, select, system

from .cli import open_backend, parse_args

LABELS = ["positive", "negative"]
SHOTS = [
    ("The food was wonderful and the staff were kind.", "positive"),
    ("Cold soup and a rude waiter.", "negative"),
    ("I would happily come back next week.", "positive"),
    ("Overpriced, bland and slow.", "negative"),
]
FEW_SHOT = "".join(f"Review: {text}\nSentiment: {label}\n\n" for text, label in SHOTS)
REVIEWS = [
    ("Best pizza I have had in years.", "positive"),
    ("The room was dirty and smelled of smoke.", "negative"),
    ("Friendly staff and a lovely view.", "positive"),
    ("We waited an hour and the order was wrong.", "negative"),
    ("Great value, I recommend it.", "positive"),
    ("Never again. Terrible service.", "negative"),
]


@function
def classify(s, review: str) -> None:
    s += system("Classify the sentiment of each review as positive or negative.")
    with s.user():
        s += FEW_SHOT
        s += "Review: " + review + "\nSentiment:"
    s += assistant(select("label", choices=LABELS))


def run_example(backend: Backend, progress_bar: bool = True) -> list[tuple[str, str, str]]:
    """(review, gold label, predicted label) per review."""
    states = classify.run_batch(
        [{"review": review} for review, _ in REVIEWS], backend=backend, progress_bar=progress_bar
    )
    labels = [state["label"] for state in states]
    return [(review, gold, label) for (review, gold), label in zip(REVIEWS, labels, strict=True)]


def main(argv: list[str] | None = None) -> None:
    with open_backend(parse_args(__doc__, argv)) as backend:
        results = run_example(backend)
    for review, gold, label in results:
        print(f"{label:8} (gold {gold:8}) {review}")
    correct = sum(gold == label for _, gold, label in results)
    print(f"accuracy: {correct}/{len(results)}")


if __name__ == "__main__":
    main()
