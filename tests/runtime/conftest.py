"""Grammar fixtures: the constraint corpus, SmolLM2's tokenizer and vocabulary, a shared
compile service, and a deterministic fake model that decodes under a grammar's masks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from stemma.bench.grammar_bench import byte_distances
from stemma.bench.tool_schemas import tool_call, weather_args

# Every pattern is in the dialect Python `re` and Rust `regex` (outlines-core) agree on.
REGEX_CORPUS: list[str] = [
    r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    r"([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?",
    r"[a-z0-9._%+-]{1,20}@[a-z0-9-]{1,15}(\.[a-z]{2,6}){1,2}",
    r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    r"\+[1-9][0-9]{0,2}( [0-9]{2,4}){2,4}",
    r"(red|green|blue|yellow)",
    r"((ab|cd)(ef|gh)?){1,3}",
    r"[\u4e00-\u9fff]{2,8}",
    r"(你好|再见)，世界[！。]",
    r"(café|naïve|über) [a-z]{3,8}",
    r"(😀|🚀|🎉){1,3}",
    r"#[0-9a-fA-F]{6}",
    r"[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?",
    r"[A-Z][a-z]+( [a-z]+){2,6}\.",
    r"[a-z]{1,8}=[0-9]{1,4}(;[a-z]{1,8}=[0-9]{1,4}){0,3}",
    r"https?://[a-z0-9-]+(\.[a-z0-9-]+)+(/[a-zA-Z0-9_-]+){0,3}",
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-(alpha|beta|rc)\.[0-9]+)?",
    r"(Yes|No)(, because [a-z ]{5,30})?\.",
    r"Name: [A-Z][a-z]+\nAge: [1-9][0-9]?",
    r"[0-9]{4}( [0-9]{4}){3}",
    r"(a\.b|c\+d|\(e\)|\[f\])",
    r"(?i)hello (world|there)",
    r"[ぁ-ん]{2,6}",
]

_TOOL_CALL = tool_call(weather_args(required=("city", "unit"), max_city_len=20))

SCHEMA_CORPUS: list[dict[str, Any]] = [
    _TOOL_CALL,
    {  # nested objects
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string", "maxLength": 16},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["street", "zip"],
            },
        },
        "required": ["name", "address"],
    },
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    {  # enums and optional fields
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"enum": [1, 2, 3]},
            "note": {"type": "string", "maxLength": 10},
        },
        "required": ["color"],
    },
    {  # numbers, booleans, nulls
        "type": "object",
        "properties": {
            "price": {"type": "number"},
            "count": {"type": "integer"},
            "active": {"type": "boolean"},
            "deleted_at": {"type": "null"},
        },
        "required": ["price", "count", "active", "deleted_at"],
    },
    {  # Optional[str]
        "type": "object",
        "properties": {
            "nickname": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]}
        },
        "required": ["nickname"],
    },
    {  # array of objects
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "done": {"type": "boolean"}},
            "required": ["id", "done"],
        },
        "maxItems": 3,
    },
    {  # $defs + $ref
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    {  # formats
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "day": {"type": "string", "format": "date"},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["id", "day", "email"],
    },
    {
        "type": "array",
        "prefixItems": [
            {"type": "string", "maxLength": 6},
            {"type": "integer"},
            {"type": "boolean"},
        ],
    },
    {  # a list of tool calls with nested arrays
        "type": "object",
        "properties": {
            "calls": {"type": "array", "items": _TOOL_CALL, "minItems": 1, "maxItems": 2},
            "final": {"type": "boolean"},
        },
        "required": ["calls", "final"],
    },
    {"type": "string", "enum": ["A", "B", 'C"D', "日本"]},
]


@pytest.fixture(scope="session")
def regex_corpus() -> list[str]:
    return REGEX_CORPUS


@pytest.fixture(scope="session")
def schema_corpus() -> list[dict[str, Any]]:
    return SCHEMA_CORPUS


@pytest.fixture(scope="session")
def smollm_tokenizer() -> Any:
    from stemma.runtime.models.loader import resolve_checkpoint
    from stemma.runtime.tokenizer import Tokenizer

    return Tokenizer(resolve_checkpoint("smollm2-135m"))


@pytest.fixture(scope="session")
def smollm_vocab(smollm_tokenizer: Any) -> Any:
    from stemma.runtime.constrained.vocabulary import Vocabulary

    return Vocabulary.from_tokenizer(smollm_tokenizer)


@pytest.fixture(scope="session")
def grammar_service(smollm_vocab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from stemma.runtime.constrained.service import GrammarService

    with GrammarService(smollm_vocab, cache_dir=tmp_path_factory.mktemp("grammar-cache")) as svc:
        yield svc


@dataclass
class FakeLM:
    """A stand-in model over the real vocabulary: a fixed random score per token id.

    Decodes greedily (seed None) or by sampling softmax(scores) (a seed) under the grammar's
    mask. After `budget` tokens it heads for the nearest final state one byte at a time, so
    every run ends with a complete match.
    """

    tokenizer: Any
    scores: np.ndarray  # [vocab_size] float64
    budget: int = 40
    _distances: dict[int, dict[int, int]] = field(default_factory=dict)

    def generate(
        self, matcher: Any, *, jump: bool, seed: int | None = None
    ) -> tuple[list[int], int]:
        """(generated ids without EOS, how many of them jump-forward appended)."""
        vocab = matcher.grammar.vocab
        rng = None if seed is None else np.random.default_rng(seed)
        row = np.empty((vocab.vocab_size + 31) // 32, dtype=np.int32)
        ids: list[int] = []
        num_forced = 0
        eos = min(vocab.eos_token_ids)
        for _ in range(2000):
            if jump:
                forced = matcher.jump_forward(self.tokenizer)
                ids += forced
                num_forced += len(forced)
            if matcher.is_finished():
                return ids, num_forced
            if len(ids) < self.budget:
                matcher.fill_mask(row)
                token = self._pick(row, vocab.vocab_size, rng)
            else:
                token = eos if matcher.is_final() else self._toward_final(matcher)
            matcher.accept_token(token)
            if token == eos:
                return ids, num_forced
            ids.append(token)
        raise AssertionError("generation did not finish")

    def _pick(self, row: np.ndarray, vocab_size: int, rng: np.random.Generator | None) -> int:
        allowed = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)
        assert allowed.any(), "empty mask"
        logits = np.where(allowed, self.scores, -np.inf)
        if rng is None:
            return int(np.argmax(logits))
        probs = np.exp(logits - logits.max())
        return int(rng.choice(vocab_size, p=probs / probs.sum()))

    def _toward_final(self, matcher: Any) -> int:
        grammar = matcher.grammar
        if id(grammar) not in self._distances:
            start = grammar.index.get_initial_state()
            self._distances[id(grammar)] = byte_distances(grammar, start)
        dist = self._distances[id(grammar)]
        best = min(
            (dist.get(nxt, 1 << 30), token_id)
            for token_id in grammar.vocab.single_byte_ids().values()
            if (nxt := grammar.index.get_next_state(matcher.state, token_id)) is not None
        )
        return best[1]


@pytest.fixture(scope="session")
def fake_lm(smollm_tokenizer: Any, smollm_vocab: Any) -> FakeLM:
    scores = np.random.default_rng(1234).standard_normal(smollm_vocab.vocab_size) * 2.0
    return FakeLM(smollm_tokenizer, scores)


def output_text(vocab: Any, ids: list[int]) -> str:
    """The exact text of `ids` (strict UTF-8: a grammar never ends mid-character)."""
    return b"".join(vocab.token_bytes[i] for i in ids).decode("utf-8")


@pytest.fixture(scope="session")
def decode_text(smollm_vocab: Any) -> Any:
    return lambda ids: output_text(smollm_vocab, ids)
