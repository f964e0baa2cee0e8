"""property_order "any" (property_order.py, unique_matcher.py) through the real llguidance
backend: an object's keys in any order, each at most once, refused at the token that would
repeat one or that leaves no allowed key to write; the closing brace refused while a required
key is missing; the default ("schema") unchanged."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import jsonschema
import numpy as np
import pytest
import stemma
from stemma.runtime.constrained.llguidance_grammar import grammar_texts
from stemma.runtime.constrained.property_order import any_order
from stemma.runtime.constrained.schema_refs import unrolled_root
from stemma.runtime.constrained.schema_rewrite import rewrite_schema
from stemma.runtime.constrained.spec import ConstraintSpec

INT, STR = {"type": "integer"}, {"type": "string"}
AREA = {
    "type": "object",
    "properties": {"dimensions": {"type": "object", "properties": {"w": INT}}, "shape": STR},
    "required": ["dimensions", "shape"],
}
CLOSED = {
    "type": "object",
    "properties": {"a": INT, "ab": INT, "b": INT},
    "required": ["b"],
    "additionalProperties": False,
}


def _valid(schema: Any, value: Any) -> bool:
    return jsonschema.Draft7Validator(schema).is_valid(value)


def _constraint(schema: Any, order: str = "any") -> stemma.Constraint:
    return stemma.Constraint(json_schema=schema, backend="llguidance", property_order=order)


def _walk(c: stemma.Constraint, text: str) -> Any:
    m = c.matcher()
    for t in c.tokenizer.encode(text):
        assert m.accept(t), text
    return m


def _token(c: stemma.Constraint, text: str) -> int:
    (t,) = c.tokenizer.encode(text)
    return t


def test_keys_in_either_order() -> None:
    swapped = '{"shape":"square","dimensions":{"w":2}}'
    in_order = '{"dimensions":{"w":2},"shape":"square"}'
    c = _constraint(AREA)
    assert c.accepts(swapped) and c.accepts(in_order)
    assert not c.accepts('{"shape":"square"}')  # required still holds
    assert not c.accepts('{"shape":"square","dimensions":{"w":"2"}}')  # and each value's schema
    schema_order = _constraint(AREA, "schema")
    assert schema_order.accepts(in_order) and not schema_order.accepts(swapped)


def test_a_repeated_key_is_refused_at_its_closing_quote() -> None:
    c = _constraint(CLOSED)
    quote = _token(c, '"')
    m = _walk(c, '{"a":1,"a')  # "a" was written: a second one may only go on to "ab"
    assert not m.allows(quote)
    assert m.allows(_token(c, "b"))
    bitmask = np.zeros((c.tokenizer.vocab_size + 31) // 32, dtype=np.int32)
    m.inner.fill_mask(bitmask)
    bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")
    assert not bits[quote] and bits[_token(c, "b")]
    # "ab" first: "a" is still new, though it begins a key already written
    assert _walk(c, '{"ab":1,"a').allows(quote)
    assert not c.accepts('{"b":1,"b":2}')
    # keys beyond the listed ones are kept unique too
    open_object = _constraint({"type": "object", "properties": {"p": INT}})
    assert open_object.accepts('{"x":1,"p":1}') and not open_object.accepts('{"x":1,"x":1}')


def test_a_key_that_can_only_end_as_a_repeat_is_refused_before_it_ends() -> None:
    c = _constraint({**CLOSED, "required": []})
    m = _walk(c, '{"b":1,"a":2,"')
    assert not m.allows(_token(c, "b"))  # "b" is written and no other key begins with it
    assert m.allows(_token(c, "ab"))
    m = _walk(c, '{"b":1,"a":2,"ab":3')
    assert not m.allows(_token(c, ","))  # every key is written: nothing may follow a comma
    assert m.allows(_token(c, "}"))


def test_the_closing_brace_waits_for_the_required_keys() -> None:
    c = _constraint(CLOSED)
    m = _walk(c, '{"a":1')
    assert not m.allows(_token(c, "}"))
    assert m.allows(_token(c, ","))
    m = _walk(c, '{"a":1,"b":2')
    assert m.allows(_token(c, "}"))


def test_additional_properties_false_still_refuses_other_keys() -> None:
    c = _constraint(CLOSED)
    assert c.accepts('{"b":1,"a":2}')
    assert not c.accepts('{"b":1,"zz":2}')
    m = _walk(c, '{"b":1,"')
    assert not m.allows(_token(c, "z"))


def test_max_properties_leaves_room_for_the_required_keys() -> None:
    schema = {"type": "object", "properties": {"a": INT, "b": INT}, "required": ["a"]}
    c = _constraint({**schema, "maxProperties": 1})
    assert c.accepts('{"a":1}') and not c.accepts('{"b":1}') and not c.accepts('{"a":1,"b":2}')
    m = _walk(c, '{"')
    assert not m.allows(_token(c, "b"))  # "b" would leave no room for "a"
    c = _constraint({**schema, "minProperties": 2})
    assert c.accepts('{"b":1,"a":2}') and not c.accepts('{"a":1}')


def test_required_under_an_ambiguous_branch_stays_in_the_grammar() -> None:
    """Which anyOf branch holds is not known while decoding: its `required` is not moved
    beside the grammar, and the schema's order is kept for its properties."""
    branches = [
        {"type": "object", "properties": {"x": INT, "y": INT}, "required": ["x"]},
        {"type": "object", "properties": {"z": INT}, "required": ["z"]},
    ]
    schema = {"anyOf": branches}
    reordered = any_order(schema)
    assert reordered is None or reordered[0] == schema
    c = _constraint(schema)
    assert c.accepts('{"x":1,"y":2}') and c.accepts('{"z":1}') and not c.accepts('{"y":2}')


def test_a_definition_every_branch_reaches_applies_whichever_branch_holds() -> None:
    """An ambiguous anyOf whose branches all hold the same item definition: that item's
    `required` applies whichever branch holds, so it moves beside the grammar and its
    branches' keys come in any order (a build config's artifacts)."""
    artifact = {
        "required": ["image"],
        "anyOf": [
            {"properties": {"image": STR, "context": STR}, "additionalProperties": False},
            {"properties": {"image": STR, "docker": STR}, "additionalProperties": False},
        ],
    }
    artifacts = {"type": "array", "items": {"$ref": "#/definitions/artifact"}}
    schema = {
        "definitions": {"artifact": artifact},
        "anyOf": [
            {"properties": {"artifacts": artifacts, "local": INT}, "additionalProperties": False},
            {"properties": {"artifacts": artifacts, "cloud": INT}, "additionalProperties": False},
        ],
    }
    _, keys = any_order(schema)
    assert keys.at(["artifacts", 0]).required == {"image"}
    c = _constraint(schema)
    assert c.accepts('{"artifacts":[{"context":".","image":"a"}]}')
    assert c.accepts('{"cloud":1,"artifacts":[{"docker":"d","image":"a"}]}')
    assert not c.accepts('{"artifacts":[{"context":"."}]}')  # the required key still holds
    assert not c.accepts('{"artifacts":[{"context":".","docker":"d","image":"a"}]}')
    # reached through one branch only, it holds only where that branch does: not moved
    one = {"anyOf": [schema["anyOf"][0], {"properties": {"artifacts": {"type": "array"}}}]}
    one["definitions"] = schema["definitions"]
    reordered = any_order(one)
    assert reordered is None or not reordered[1].at(["artifacts", 0]).required
    # unless the other branch's value there cannot be an array: then that one branch holds
    only = {"anyOf": [schema["anyOf"][0], {"properties": {"artifacts": INT}}]}
    only["definitions"] = schema["definitions"]
    assert any_order(only)[1].at(["artifacts", 0]).required == {"image"}
    # nor where it is also reached under a `not`
    negated = {**schema, "not": {"properties": {"artifacts": artifacts}}}
    reordered = any_order(negated)
    assert reordered is None or not reordered[1].at(["artifacts", 0]).required


PING = {
    "type": "object",
    "properties": {"method": {"const": "ping"}, "params": {"properties": {"id": INT}}},
    "required": ["method"],
}
CALL = {
    "type": "object",
    "properties": {
        "method": {"const": "call"},
        "params": {"properties": {"name": STR, "args": {}}, "required": ["name", "args"]},
    },
    "required": ["method", "params"],
}


def test_a_branch_chosen_by_a_value_keeps_its_keys_in_any_order() -> None:
    """A discriminated union (each branch requires `method` and lists its own value): the
    value says which branch holds, so each branch's `required`, and those of the objects
    under it, are checked beside the grammar once the value is known; before it, where an
    inner object closes first, the check waits for it (a request named by its method)."""
    schema = {"anyOf": [PING, CALL]}
    _, keys = any_order(schema)
    assert not keys.at([]).required and not keys.at(["params"]).required
    (conditions, required, _), *_ = keys.conditional_at(["params"])
    assert conditions == ((0, "method", frozenset({("string", "call")})),)
    assert required == {"name", "args"} and keys.watched_at([]) == {"method"}
    c = _constraint(schema)
    for text in (
        '{"method":"call","params":{"args":1,"name":"f"}}',
        '{"params":{"args":1,"name":"f"},"method":"call"}',  # the value after the object
        '{"params":{"args":1},"method":"ping"}',  # ping's params require nothing
        '{"method":"ping"}',
    ):
        assert c.accepts(text), text
    for text in (
        '{"params":{"args":1},"method":"call"}',  # call's params need a name
        '{"method":"call","params":{"args":1}}',
        '{"method":"call"}',  # call needs params
        '{"params":{"args":1,"name":"f"}}',  # no method: no branch holds
        '{"method":"other"}',
    ):
        assert not c.accepts(text), text
    m = _walk(c, '{"params":{"args":1},"method":"call')
    assert not m.allows(_token(c, '"'))  # refused where the value is known
    m = _walk(c, '{"method":"call","params":{"args":1')
    assert not m.allows(_token(c, "}"))  # and at the brace, where it is known already


def test_a_branch_chosen_by_its_holders_required_key() -> None:
    """The discriminating key may be required by the object holding the `anyOf` rather than
    by each branch; nested discriminators add their conditions (a geometry with a type)."""
    point = {"properties": {"type": {"const": "Point"}, "coordinates": INT}}
    point["required"] = ["coordinates"]
    line = {"properties": {"type": {"enum": ["Line", "Ray"]}, "points": {"type": "array"}}}
    line["required"] = ["points"]
    schema = {
        "type": "object",
        "properties": {"type": STR, "shape": {"required": ["type"], "anyOf": [point, line]}},
        "required": ["type"],
        "anyOf": [
            {"properties": {"type": {"const": "shape"}}, "required": ["shape"]},
            {"properties": {"type": {"const": "none"}}},
        ],
    }
    c = _constraint(schema)
    assert c.accepts('{"shape":{"coordinates":1,"type":"Point"},"type":"shape"}')
    assert c.accepts('{"type":"shape","shape":{"points":[],"type":"Ray"}}')
    assert c.accepts('{"type":"none","shape":{"type":"Line","points":[]}}')
    assert not c.accepts('{"shape":{"points":[],"type":"Point"},"type":"shape"}')
    assert not c.accepts('{"type":"shape","shape":{"type":"Line"}}')
    assert not c.accepts('{"type":"shape"}')
    assert not c.accepts('{"shape":{"coordinates":1,"type":"Point"}}')


OBJECT = {"type": "object"}
MOUNT = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "object",
            "properties": {
                "local": STR,
                "container": STR,
                "type": {"enum": ["local"]},
                "opts": {**OBJECT, "required": ["ro"]},
            },
            "required": ["local", "container"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "name": STR,
                "container": STR,
                "type": {"enum": ["cache"]},
                "opts": OBJECT,
            },
            "required": ["type", "name", "container"],
            "additionalProperties": False,
        },
    ]
}


def test_a_branch_chosen_by_which_key_is_there_keeps_its_keys_in_any_order() -> None:
    """Closed object branches told apart by a key each requires and the other does not list
    (a volume mount from a local path or a named cache): the key's presence chooses the
    branch, and the object must have one of those keys. Every set of keys, in both orders, is
    decided as jsonschema decides it."""
    schema = {"type": "array", "items": MOUNT}
    _, keys = any_order(schema)
    checks = keys.conditional_at([0])
    assert ((), frozenset(), ("any", (("has", "local"), ("has", "name")))) in checks
    assert (((1, "local", None),), frozenset({"local", "container"}), None) in checks
    c = _constraint(schema)
    names = ["local", "name", "container", "type"]
    for n in range(len(names) + 1):
        for subset in itertools.combinations(names, n):
            for kind in ("local", "cache") if "type" in subset else ("",):
                item = {k: kind if k == "type" else "x" for k in subset}
                valid = jsonschema.Draft7Validator(schema).is_valid([item])
                for ordered in (subset, subset[::-1]):
                    text = json.dumps([{k: item[k] for k in ordered}], separators=(",", ":"))
                    assert c.accepts(text) == valid, text
    # an inner object closed before the key that chooses its rule: checked when it comes
    assert c.accepts('[{"opts":{},"container":"c","type":"cache","name":"n"}]')
    assert c.accepts('[{"opts":{"ro":1},"container":"c","local":"l"}]')
    assert not c.accepts('[{"opts":{},"container":"c","local":"l"}]')
    m = _walk(c, '[{"opts":{},"container":"c","')
    assert m.allows(_token(c, "name"))  # the cache branch is still open
    assert not c.accepts('[{"opts":{},"local":"l","container":"c"}]')


TREE = {
    "type": "object",
    "required": ["kind"],
    "properties": {
        "kind": STR,
        "size": {"$ref": "#/definitions/size"},
        "children": {"type": "array", "items": {"$ref": "#"}},
    },
    "definitions": {"size": {"type": "object", "properties": {"w": INT}, "required": ["w"]}},
}


def test_a_root_that_refers_to_itself_is_unrolled_once() -> None:
    """The root of a tree is reached again under its children, at paths without end: its
    first level becomes a copy with the definitions it uses copied in, and the references
    go to a copy of the root among the definitions. The same instances pass, and the top
    level's keys come in any order (deeper levels keep the schema's order)."""
    unrolled = unrolled_root(TREE, 100_000)
    assert unrolled["properties"]["children"]["items"] == {"$ref": "#/definitions/root0"}
    assert unrolled["properties"]["size"] == TREE["definitions"]["size"]  # a copy in place
    assert "#" not in {ref for ref in re.findall(r'"\$ref": "([^"]*)"', json.dumps(unrolled))}
    instances = [
        {"kind": "a"},
        {"kind": "a", "children": [{"kind": "b", "size": {"w": 1}}]},
        {"kind": "a", "children": [{"kind": "b", "children": [{}]}]},
        {"children": []},
        {"kind": "a", "size": {}},
    ]
    for value in instances:
        assert _valid(unrolled, value) == _valid(TREE, value), value
    assert unrolled_root({"type": "object", "properties": {"a": INT}}, 100_000) is None
    assert unrolled_root(TREE, 10) is None  # copies past the size bound: left as written
    _, keys = any_order(TREE)
    assert keys.at([]).required == {"kind"} and keys.at(["size"]).required == {"w"}
    c = _constraint(TREE)
    assert c.accepts('{"size":{"w":1},"children":[],"kind":"a"}')
    assert c.accepts('{"children":[{"kind":"b","children":[]}],"kind":"a"}')
    assert not c.accepts('{"children":[],"size":{"w":1}}')
    assert not c.accepts('{"kind":"a","children":[{"children":[]}]}')


def test_branches_whose_values_overlap_keep_their_required_in_the_grammar() -> None:
    both = {**PING, "properties": {**PING["properties"], "method": {"enum": ["ping", "call"]}}}
    schema = {"anyOf": [both, CALL]}
    reordered = any_order(schema)
    assert reordered is None or not reordered[1].conditional
    c = _constraint(schema)
    assert c.accepts('{"method":"call","params":{"args":1}}')  # the first branch holds
    assert not c.accepts('{"params":{"args":1}}')


BUILD = {
    "type": "object",
    "properties": {"image": STR, "build": STR, "dockerfile": STR, "ports": INT},
    "additionalProperties": False,
    "oneOf": [
        {"required": ["image"], "not": {"required": ["dockerfile"]}},
        {"required": ["build"]},
    ],
}


@pytest.mark.parametrize("rewritten", [False, True])
def test_a_one_of_saying_which_keys_are_there_is_checked_at_the_brace(rewritten: bool) -> None:
    """A `oneOf` whose branches only say which keys are there (a container built from an
    image or from a directory) becomes a formula over the keys, checked beside the grammar:
    every set of keys, in both orders, is decided as jsonschema decides it."""
    schema = rewrite_schema(BUILD, lambda _: True)[0] if rewritten else BUILD
    out, keys = any_order(schema)
    assert keys.at([]).formula is not None and "oneOf" not in out and "anyOf" not in out
    c = _constraint(BUILD)
    names = list(BUILD["properties"])
    for n in range(len(names) + 1):
        for subset in itertools.combinations(names, n):
            value = {k: 1 if k == "ports" else "x" for k in subset}
            valid = jsonschema.Draft7Validator(BUILD).is_valid(value)
            for ordered in (subset, subset[::-1]):
                text = json.dumps({k: value[k] for k in ordered}, separators=(",", ":"))
                assert c.accepts(text) == valid, text


def test_a_key_that_leaves_no_way_to_close_is_refused_as_it_begins() -> None:
    schema = {
        "type": "object",
        "properties": {"a": INT, "b": INT, "c": INT},
        "additionalProperties": False,
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    c = _constraint(schema)
    assert c.accepts('{"c":1,"b":1}') and not c.accepts('{"a":1,"b":2}') and not c.accepts("{}")
    m = _walk(c, '{"a":1,"')
    assert m.allows(_token(c, "c")) and not m.allows(_token(c, "b"))  # b leaves no way out
    m = _walk(c, '{"a":1,"c":2')
    assert not m.allows(_token(c, ","))  # no key may follow that can help


def test_a_document_in_one_token_is_checked_too() -> None:
    (t,) = _constraint(AREA).tokenizer.encode("{}")  # one token opens and closes it
    assert not _constraint(AREA).accepts("{}") and not _constraint(AREA).matcher().allows(t)


def test_a_conjunct_keeping_its_required_keeps_the_others_in_schema_order() -> None:
    """llguidance writes an object's listed properties before its patterned ones: where one
    subschema of an object keeps `required` in the grammar, those it is joined with (allOf,
    $ref) keep their listed properties too, so the schema's own order stays accepted."""
    item = {"type": "object", "properties": {"id": STR, "name": STR}, "required": ["id"]}
    plate = {
        "allOf": [
            {"$ref": "#/definitions/item"},
            {"properties": {"kind": {"const": "plate"}}, "required": ["kind"]},
        ]
    }
    tip = {
        "allOf": [
            {"$ref": "#/definitions/item"},
            {"properties": {"kind": {"const": "tip"}}, "required": ["kind"]},
        ]
    }
    schema = {
        "definitions": {"item": item, "plate": plate, "tip": tip},
        "type": "object",
        "properties": {
            "item": {"anyOf": [{"$ref": "#/definitions/plate"}, {"$ref": "#/definitions/tip"}]}
        },
    }
    out, _ = any_order(schema)
    assert "properties" in out["definitions"]["item"]  # not turned into patterns
    c = _constraint(schema)
    assert c.accepts('{"item":{"id":"a","name":"b","kind":"plate"}}')
    assert not c.accepts('{"item":{"name":"b","kind":"plate"}}')


def test_a_condition_on_a_required_key_leaves_the_keys_in_any_order() -> None:
    """`if` / `then` on a key the object requires: the rewrite's "not if" branch says that key
    is there again; the object already requires it, so that `required` is left out and no
    conjunct keeps the schema's order (an app config whose type picks its options)."""
    schema = {
        "type": "object",
        "properties": {"type": STR, "build": STR},
        "required": ["type"],
        "allOf": [
            {
                "if": {"properties": {"type": {"const": "static"}}},
                "then": {"properties": {"routing": STR, "build": STR}},
            }
        ],
    }
    c = _constraint(schema)
    assert c.accepts('{"routing":"r","build":"b","type":"static"}')
    assert c.accepts('{"build":"b","type":"other","routing":1}')
    assert not c.accepts('{"routing":1,"type":"static"}')  # then holds
    assert not c.accepts('{"routing":"r","build":"b"}')  # type is required


def test_names_are_matched_exactly() -> None:
    schema = {"type": "object", "properties": {"a.b": INT, "c": STR}, "additionalProperties": False}
    out, _ = any_order(schema)
    assert set(out["patternProperties"]) == {"^a\\.b$", "^c$"}
    c = _constraint(schema)
    assert c.accepts('{"c":"x","a.b":2}') and not c.accepts('{"axb":2}')


def test_names_saying_the_same_share_one_pattern() -> None:
    """Fewer patterns, which llguidance checks pairwise for overlap; annotations aside."""
    described = {**INT, "description": "a count"}
    schema = {
        "type": "object",
        "properties": {"a.b": INT, "c": STR, "d": described, "e": {**STR, "minLength": 2}},
        "required": ["d"],
    }
    out, keys = any_order(schema)
    assert set(out["patternProperties"]) == {"^(?:a\\.b|d)$", "^c$", "^e$"}
    assert keys.at([]).required == {"d"}
    c = _constraint(schema)
    assert c.accepts('{"e":"xy","d":1,"c":"x","a.b":2,"z":null}')
    assert not c.accepts('{"d":"x"}') and not c.accepts('{"d":1,"e":"x"}')
    assert not c.accepts('{"a.b":1}') and not c.accepts('{"d":1,"d":2}')


def test_own_patterns_apart_from_the_names_leave_the_keys_in_any_order() -> None:
    """An object's own patternProperties that match none of its listed names sit beside
    their exact-name patterns; one that matches a name keeps the schema's order."""
    schema = {
        "type": "object",
        "properties": {"name": STR, "tasks": INT},
        "patternProperties": {"^\\.": STR},
        "additionalProperties": False,
    }
    out, _ = any_order(schema)
    assert set(out["patternProperties"]) == {"^name$", "^tasks$", "^\\."}
    c = _constraint(schema)
    assert c.accepts('{"tasks":1,".x":"y","name":"n"}')
    assert not c.accepts('{"tasks":"1"}') and not c.accepts('{".x":1}')
    required = _constraint({**schema, "required": ["name"]})  # the scanner knows the patterns
    assert required.accepts('{".x":"y","name":"n"}') and not required.accepts('{".x":"y"}')
    overlapping = {**schema, "patternProperties": {"^t": INT}}
    reordered = any_order(overlapping)
    assert reordered is None or "properties" in reordered[0]


def test_schema_order_is_the_default_and_keeps_the_cache_key() -> None:
    spec = ConstraintSpec.create(json_schema=AREA)
    assert spec.property_order == "schema"
    assert spec.key == ConstraintSpec.create(json_schema=AREA, property_order="schema").key
    assert spec.key != ConstraintSpec.create(json_schema=AREA, property_order="any").key
    c = stemma.Constraint(json_schema=AREA, backend="llguidance")
    assert not c.accepts('{"shape":"square","dimensions":{"w":2}}')


def test_bad_values_name_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="property_order must be one of .*'sorted'"):
        ConstraintSpec.create(json_schema=AREA, property_order="sorted")
    with pytest.raises(ValueError, match="applies to a json_schema only"):
        ConstraintSpec.create(regex="a+", property_order="any")
    with pytest.raises(ValueError, match="needs the llguidance grammar backend"):
        stemma.Constraint(json_schema=AREA, backend="outlines", property_order="any")
    with pytest.raises(ValueError, match="sampling_params.property_order"):
        from stemma.runtime.sampling.params import SamplingParams

        SamplingParams(json_schema=json.dumps(AREA), property_order="sorted")


def test_a_schema_refused_as_written_is_not_tried_reordered_as_written() -> None:
    """Where llguidance refuses a keyword in the schema's order (checked without the
    vocabulary), the reordered form as written is skipped: it would be refused too, after
    the costlier work on its patterns. The first grammar tried is the rewritten one."""
    schema = {"type": "object", "properties": {"a": INT, "b": INT}, "not": {"required": ["a"]}}
    spec = ConstraintSpec.create(json_schema=schema, property_order="any")
    first = next(grammar_texts(spec))
    assert first.keys is not None and '"not"' not in first.grammar
    c = _constraint(schema)
    assert c.accepts('{"b":1}') and not c.accepts('{"b":1,"a":2}')


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        ({"anyOf": [PING, CALL]}, '{"params":{"args":[1,{}],"name":"f"},"method":"call"}'),
        ({"type": "array", "items": MOUNT}, '[{"opts":{"ro":true},"container":"c","local":"l"}]'),
        (BUILD, '{"ports":1,"dockerfile":"d","build":"b"}'),
        (  # after the third `"ab`, `":` would repeat "ab" in an open object
            {"type": "object", "properties": {"ab": INT}},
            ['{"ab":1,"abc":{"x":"a","y":"b"},"', "ab", 'd":3}'],
        ),
        (
            {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}},
            '{"xs":[true,1,[2],{"a":[3,3]},null,false],"k":1}',  # a second true: refused
        ),
        (
            {
                "anyOf": [
                    {
                        "properties": {"on": {"const": True}, "o": {"required": ["x"]}},
                        "required": ["on"],
                    },
                    {"properties": {"on": {"const": False}}, "required": ["on"]},
                ]
            },
            '{"o":{},"on":false}',  # true there would break the rule o waits on
        ),
    ],
)
def test_the_mask_refuses_what_the_matcher_refuses(schema: Any, text: Any) -> None:
    """The mask tries only the tokens that may fail where the output stands (unique_matcher's
    `near`); each token the grammar allows is checked one by one against it (in a string,
    each with a quote: without one, a token cannot end it)."""
    c = _constraint(schema)
    m = c.matcher().inner
    words = (c.tokenizer.vocab_size + 31) // 32
    pieces = [text] if isinstance(text, str) else text  # each piece tokenized apart
    for t in [t for piece in pieces for t in c.tokenizer.encode(piece)]:
        grammar, mask = np.zeros(words, dtype=np.int32), np.zeros(words, dtype=np.int32)
        m.inner.fill_mask(grammar)
        m.fill_mask(mask)
        allowed = np.flatnonzero(np.unpackbits(grammar.view(np.uint8), bitorder="little"))
        if m.scanner.in_string:
            allowed = allowed[m.tokens.has_quote[allowed]]
        kept = np.unpackbits(mask.view(np.uint8), bitorder="little")
        eos = m.eos_token_ids
        for token in allowed.tolist():
            assert bool(kept[token]) == (token in eos or not m.refuses(token)), token
        m.accept_token(t)
    assert m.is_final()
