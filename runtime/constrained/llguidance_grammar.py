"""A ConstraintSpec as an llguidance grammar, and llguidance's refusals named by keyword and path.

JSON schemas keep their own semantics (objects stay open unless additionalProperties says
otherwise; $ref/$defs, anyOf/allOf, enum/const, numeric bounds, lengths, pattern, format and
item counts are honoured); JSON is emitted compact, as the outlines backend does. What llguidance
cannot compile as written (`not`, overlapping `oneOf`, `if`/`then`, `dependencies`, unknown
formats) is first rewritten exactly where that can be done (schema_rewrite.py); what is left is
refused, never loosened, unless `strict=False`, where it is approximated and listed as a warning.
Which grammar a spec resolved to, or its refusal, is kept in a bounded `Resolutions`.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, NamedTuple

from ...lang.constraints import DTYPE_REGEX as _REGEX_BY_TYPE
from ...lang.constraints import choices_regex
from .llguidance_refusal import may_be_refused, refused_as_written
from .property_order import ObjectKeys, any_order
from .regex_check import normalize_regex
from .schema_logic import DATA_KEYWORDS, combinators_ahead, pointer_escape
from .schema_rewrite import Rewrite, rewrite_schema
from .unique_items import UniqueArrays

DTYPE_REGEX = {t.__name__: regex for t, regex in _REGEX_BY_TYPE.items()}
_COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# Object members whose keys are property names, not keywords; their values are subschemas.
_NAMED_SUBSCHEMAS = frozenset(
    "properties patternProperties $defs definitions dependentSchemas".split()
)
# Keywords llguidance refuses in some or all of their forms (an object key in the JSON text).
_MAY_REFUSE = re.compile(
    r'"(not|if|then|else|oneOf|dependencies|dependentRequired|dependentSchemas|uniqueItems|'
    r'propertyNames|contains|unevaluatedProperties|unevaluatedItems)":'
)
_UNSATISFIABLE = "Unsatisfiable schema"  # how llguidance's error says no instance can pass
ORDER_KEPT = (
    "property_order 'any' not applied: llguidance refused the schema with its properties in "
    "any order, so they keep the schema's order"
)


class Candidate(NamedTuple):
    """A grammar to try, notes on how it was made, the key rules to enforce beside it
    (property_order "any"; None: properties in the schema's order), and whether it is the
    schema as written, in its own order (its refusal is the one to name first)."""

    grammar: str
    notes: list[str]
    keys: ObjectKeys | None = None
    as_written: bool = False
    unique: UniqueArrays | None = None  # where a rewrite left uniqueItems to the matcher


def grammar_texts(spec: Any) -> Iterator[Candidate]:
    """The llguidance grammars (JSON documents) to try for a ConstraintSpec, in order, each
    with notes on how it was made: a schema as written, then (where it differs) rewritten
    (schema_rewrite.py), so that what llguidance takes as written is never rewritten; one
    llguidance surely refuses as written (llguidance_refusal.py) comes after its rewrite, for
    the refusal to name what blocks it where the rewrite is refused too. Under
    property_order "any", both first with their objects' properties in any order
    (property_order.py), then as in the schema's order. Lazy: the rewrite is made only for a
    caller that goes on past the schema as written. A regex is checked as for outlines
    (regex_check.py: unsupported features named, ^/$ dropped), so both backends take the
    same dialect; grammar errors surface when llguidance builds it."""
    from llguidance import LLMatcher

    if spec.regex is not None:
        yield Candidate(LLMatcher.grammar_from_regex(normalize_regex(spec.regex)), [])
        return
    if spec.choices is not None:
        yield Candidate(LLMatcher.grammar_from_regex(choices_regex(spec.choices)), [])
        return
    if spec.dtype is not None:
        yield Candidate(LLMatcher.grammar_from_regex(DTYPE_REGEX[spec.dtype]), [])
        return
    if spec.ebnf is not None:
        yield Candidate(ebnf_grammar(spec.ebnf), [])
        return
    options: dict[str, Any] = dict(_COMPACT)
    if spec.whitespace is not None:
        options = {"whitespace_flexible": False, "whitespace_pattern": spec.whitespace}
    if not spec.strict:
        options |= {"lenient": True, "coerce_one_of": True}

    def reordered_grammar(schema: Any) -> str:  # property_order's copy has them ahead
        return with_options(json.dumps(schema), options)

    @cache
    def surely_refused() -> bool:
        """llguidance refuses the schema as written for a keyword it does not implement, as a
        walk of the parsed schema tells (llguidance_refusal.py), without its compile (under
        strict=False, it approximates such a keyword and warns)."""
        if not spec.strict or not may_be_refused(spec.json_schema):
            return False
        return refused_as_written(schema(), known_format)

    def written_refused() -> bool:
        """llguidance refuses the schema as written, where a keyword it may refuse is in it
        (checked without the vocabulary): then it refuses it reordered too, and finds that
        out only after the costlier work on the patterns."""
        if not _MAY_REFUSE.search(spec.json_schema):
            return False
        return surely_refused() or LLMatcher.validate_grammar_with_warnings(written(), None)[0]

    @cache
    def schema() -> Any:  # parsed where a candidate needs it, not for the text as written
        return json.loads(spec.json_schema)

    @cache
    def written() -> str:
        """The schema as written (built once: written_refused may need it first); its text
        as it is where no combinator needs moving."""
        return schema_grammar(spec.json_schema, options)

    rewrite: Rewrite | None = None
    kept: list[str] = []  # why properties keep the schema's order, once "any" was tried
    if spec.property_order == "any":
        if not written_refused() and (reordered := any_order(schema())):
            yield Candidate(reordered_grammar(reordered[0]), [], reordered[1])
            kept = [ORDER_KEPT]
        rewrite = rewrite_schema(schema(), known_format)
        # tried without checking it first: the check would build as much as the compile
        if rewrite.schema != schema() and (reordered := any_order(rewrite.schema)) is not None:
            grammar = reordered_grammar(reordered[0])
            yield Candidate(grammar, rewrite.notes, reordered[1], unique=rewrite.unique)
            kept = [ORDER_KEPT]
    # refused surely: tried only where its rewrite is too, which names what blocks it
    if not surely_refused():
        yield Candidate(written(), kept, as_written=True)
    if rewrite is None:
        rewrite = rewrite_schema(schema(), known_format)
    if rewrite.text is not None and rewrite.schema != schema():
        grammar = schema_grammar(rewrite.text, options, rewrite.schema)
        yield Candidate(grammar, [*rewrite.notes, *kept], unique=rewrite.unique)
    if surely_refused():
        yield Candidate(written(), kept, as_written=True)


@dataclass(slots=True, frozen=True)
class Resolution:
    """What a spec resolved to: the grammar llguidance takes (as written or rewritten, with
    the rewrite's notes), or the refusal that names why none does."""

    grammar: str | None = None
    notes: tuple[str, ...] = ()
    error: str | None = None
    keys: ObjectKeys | None = None  # key rules beside the grammar (property_order "any")
    unique: UniqueArrays | None = None  # and uniqueItems (strict only)


class Resolutions:
    """Resolutions by (spec, grammar-size limit), LRU over at most `max_entries` (each holds
    its spec and grammar text, about twice the schema). Thread-safe: the check at the request
    boundary and the compile workers share it, so a spec's grammar texts are built and tried
    once. Only what holds without the vocabulary belongs here."""

    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, int], Resolution] = OrderedDict()

    def get(self, spec: Any, grammar_size: int) -> Resolution | None:
        with self._lock:
            if (found := self._entries.get((spec, grammar_size))) is not None:
                self._entries.move_to_end((spec, grammar_size))
            return found

    def put(self, spec: Any, grammar_size: int, resolution: Resolution) -> None:
        with self._lock:
            self._entries[(spec, grammar_size)] = resolution
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


def ebnf_grammar(text: str) -> str:
    """A GBNF grammar (llama.cpp's dialect, `root ::= ...`) or a Lark one (`start: ...`) as an
    llguidance grammar; ValueError says where the text does not parse."""
    from llguidance import grammar_from

    try:
        return grammar_from("ebnf", text)
    except ValueError as err:
        raise ValueError(f"invalid ebnf grammar: {err}") from None


def combinators_first(node: Any) -> Any:
    """`node` with every subschema's combinators ahead (schema_logic.combinators_ahead).
    Unchanged where nothing moves."""
    if isinstance(node, list):
        items = [combinators_first(item) for item in node]
        return items if any(a is not b for a, b in zip(items, node)) else node
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] | None = None
    for key, child in node.items():
        if key in DATA_KEYWORDS:
            continue
        if key in _NAMED_SUBSCHEMAS and isinstance(child, dict):
            new: Any = {name: combinators_first(sub) for name, sub in child.items()}
            new = child if all(new[n] is child[n] for n in child) else new
        else:
            new = combinators_first(child)
        if new is not child:
            out = dict(node) if out is None else out
            out[key] = new
    return combinators_ahead(node if out is None else out)


def schema_grammar(text: str, options: dict[str, Any], schema: Any = None) -> str:
    """The llguidance grammar of the JSON schema `text` (`schema`, where the caller has it
    parsed), with every subschema's combinators ahead: the text as it is where none moves."""
    if '"patternProperties"' in text and combinators_move(text):
        text = json.dumps(combinators_first(json.loads(text) if schema is None else schema))
    return with_options(text, options)


def with_options(text: str, options: dict[str, Any]) -> str:
    """The llguidance grammar of the JSON schema object `text` under the JSON `options`, put
    in its text as its last key, "x-guidance": where llguidance's own merge puts them, after
    parsing the whole schema into its objects and printing it again, at ten times the cost
    (and last: llguidance 1.9 reads keys in two parts around a combinator, see
    combinators_first). A schema with options of its own goes through that merge."""
    from llguidance import LLMatcher

    if '"x-guidance"' in text or not text.lstrip().startswith("{"):
        return LLMatcher.grammar_from_json_schema(text, overrides=options)
    head = text.rstrip()[:-1].rstrip()  # a JSON object (schema_to_json): before its "}"
    joined = "" if head.endswith("{") else ","
    return LLMatcher.grammar_from_json_schema(f'{head}{joined}"x-guidance":{json.dumps(options)}}}')


def combinators_move(text: str) -> bool:
    """Whether combinators_first moves a key of the JSON schema `text`: some object has
    `patternProperties` and a combinator after another of its keys. Found as the text is parsed
    (a hook per object, about a third of what walking the parsed schema costs); an object
    under `enum` / `const` that would move counts too (combinators_first then leaves it)."""
    moves = False

    def look(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal moves
        node = dict(pairs)
        if not moves and "patternProperties" in node:
            moves = list(combinators_ahead(node)) != list(node)
        return node

    json.loads(text, object_pairs_hook=look)
    return moves


@lru_cache(maxsize=256)
def known_format(name: str) -> bool:
    """llguidance checks this `format` (it refuses a format it does not know)."""
    from llguidance import LLMatcher

    grammar = LLMatcher.grammar_from_json_schema({"type": "string", "format": name})
    is_error, _ = LLMatcher.validate_grammar_with_warnings(grammar, None)
    return not is_error


def refusal(spec: Any, error: str) -> str:
    """llguidance's compile error, with the schema keyword and its path where one is named."""
    first = one_line(error)
    if spec.json_schema is None:
        kind = "regex" if spec.regex is not None else "ebnf" if spec.ebnf else "constraint"
        return f"{kind} not supported by llguidance: {first}"
    if first.startswith(_UNSATISFIABLE):
        return f"json_schema has no valid instance, so no output can match it (llguidance: {first})"
    schema = json.loads(spec.json_schema)
    keywords, value = _named_keywords(first)
    found = _find(schema, keywords, value, "#") if keywords else None
    if found:
        keyword, path = found
        return (
            f"json_schema keyword {keyword!r} at {path} is not supported by the llguidance "
            f"backend ({first}); remove it, or pass strict=False to approximate it"
        )
    return f"json_schema not supported by the llguidance backend: {first}"


def one_line(error: str) -> str:
    """An llguidance error on one line: its first line, or, where that is a header ending in
    ':' (a regex parse error), the header with the offending text and the reason under it,
    without the line of carets that points into the text."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip().strip("^")]
    if not lines:
        return "unknown error"
    return " ".join(lines) if lines[0].endswith(":") else lines[0]


def blocking_error(errors: list[str]) -> str:
    """Of the errors of a schema as written and rewritten: the rewritten one where it finds
    the schema unsatisfiable (the rewrite is exact: so is the schema as written) or names a
    keyword (what is left to block it), else the first (the rewrite added nothing of use)."""
    last = one_line(errors[-1]) if errors else ""
    if len(errors) > 1 and (last.startswith(_UNSATISFIABLE) or _named_keywords(last)[0]):
        return errors[-1]
    return errors[0] if errors else ""


def _named_keywords(message: str) -> tuple[tuple[str, ...], Any]:
    """(keywords, value or None) that an llguidance error message names, if any."""
    if m := re.search(r"Unimplemented keys: \[([^\]]+)\]", message):
        return tuple(json.loads(f"[{m.group(1)}]")), None
    if m := re.search(r"Unknown format: (\S+)", message):
        return ("format",), m.group(1)
    if "oneOf" in message:
        return ("oneOf",), None
    if "min/maxProperties" in message:
        return ("minProperties", "maxProperties"), None
    return (), None


def _find(node: Any, keywords: tuple[str, ...], value: Any, path: str) -> tuple[str, str] | None:
    """(keyword, JSON pointer) of the first subschema holding one of `keywords` (equal to
    `value` if given), depth first in document order."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            if found := _find(item, keywords, value, f"{path}/{i}"):
                return found
        return None
    if not isinstance(node, dict):
        return None
    for keyword in keywords:
        if keyword in node and (value is None or node[keyword] == value):
            return keyword, path
    for key, child in node.items():
        if key in DATA_KEYWORDS:
            continue
        if key in _NAMED_SUBSCHEMAS and isinstance(child, dict):
            for name, sub in child.items():
                if found := _find(sub, keywords, value, f"{path}/{key}/{pointer_escape(name)}"):
                    return found
        elif found := _find(child, keywords, value, f"{path}/{key}"):
            return found
    return None
