"""Tool calls for /v1/chat/completions: the prompt that offers the tools, the JSON-schema
constraint for forced calls, and the rule that reads a completion as a tool call.

The model is asked to answer a call as one JSON object `{"name": ..., "arguments": {...}}`.
- tool_choice "required" / a named function: the completion is generated under a JSON-schema
  constraint (the named tool, or any offered tool) built from the tools' `parameters`, so it
  parses and its arguments validate; it is always a tool call (unless cut off by max_tokens).
- tool_choice "auto" (the default when tools are given): the completion is a tool call exactly
  when its text, whitespace-trimmed and with one optional `<tool_call>...</tool_call>` wrapper
  or ``` fence removed, parses as a JSON object {"name": N, "arguments": A} or a non-empty list
  of them, where every N names an offered tool and every A is an object (or JSON text of one;
  "parameters" is accepted for "arguments"). Anything else is plain content. It is generated
  under `auto_call_grammar`: a reply that opens a call (`{`, `[` or `<tool_call>`, after any
  whitespace) must be one, valid for an offered tool's parameters, and end there; any other
  reply is free text. A list of calls only with parallel_tool_calls (OpenAI's default: on).
- tool_choice "none": the tools are not offered; the completion is content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ...constrained.schema_logic import DATA_KEYWORDS
from .protocol import ChatCompletionRequest, NamedToolChoice, Tool

_WRAPPER = re.compile(r"^<tool_call>(.*)</tool_call>$|^```(?:json)?(.*)```$", re.DOTALL)
_EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(slots=True)
class ToolPlan:
    """How one chat request uses its tools."""

    tools: list[Tool]
    mode: str  # "none" | "auto" | "forced"
    forced_name: str | None = None  # for a named tool_choice

    @property
    def names(self) -> set[str]:
        return {t.function.name for t in self.tools}


def plan_tools(body: ChatCompletionRequest) -> ToolPlan:
    """Resolve tools + tool_choice; ValueError names what is inconsistent."""
    tools = body.tools or []
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if tools else "none")
    if not tools and choice != "none":
        raise ValueError("tool_choice needs a non-empty 'tools' list")
    if len({t.function.name for t in tools}) != len(tools):
        raise ValueError("tools has two functions with the same name")
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in {t.function.name for t in tools}:
            raise ValueError(f"tool_choice names {name!r}, which is not in tools")
        return ToolPlan(tools, "forced", name)
    return ToolPlan(tools, {"none": "none", "auto": "auto", "required": "forced"}[choice])


def tool_system_prompt(plan: ToolPlan) -> str:
    specs = "\n".join(
        json.dumps(
            {
                "name": t.function.name,
                "description": t.function.description or "",
                "parameters": t.function.parameters or _EMPTY_PARAMS,
            },
            ensure_ascii=False,
        )
        for t in plan.tools
    )
    call = (
        'respond with only a JSON object {"name": <function name>, "arguments": '
        "<an object of arguments>}"
    )
    if plan.forced_name is not None:
        rule = f"You must call the function {plan.forced_name!r}: {call}."
    elif plan.mode == "forced":
        rule = f"You must call one of these functions: {call}."
    else:
        rule = f"To call a function, {call} and nothing else. Otherwise answer normally."
    return f"You can call these functions:\n{specs}\n{rule}"


def _rebase_refs(node: Any, base: str) -> Any:
    """A copy of the schema `node` whose local `$ref`s ("#...") point under `base`."""
    if isinstance(node, list):
        return [_rebase_refs(x, base) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = f"#{base}{value[1:]}"
        else:  # enum / const / default / examples are data, but hold no string "$ref" keys
            out[key] = value if key in DATA_KEYWORDS else _rebase_refs(value, base)
    return out


def _placed_parameters(tools: list[Tool]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each tool's parameters as a call schema holds them, and the `$defs` its root carries.

    Inside the call wrapper a tool's parameters are no longer the document's root, so a
    `$ref` they hold ("#/$defs/Address", as pydantic writes nested models, or "#") would
    resolve against the wrapper. Such parameters move whole to `#/$defs/<tool name>` (names
    are unique and JSON-pointer safe) with every local ref rebased there, and the call refers
    to them: the same schema, resolved where it was written. ValueError for parameters nested
    past what Python's recursion takes."""
    placed: dict[str, Any] = {}
    defs: dict[str, Any] = {}
    for tool in tools:
        name, params = tool.function.name, tool.function.parameters or _EMPTY_PARAMS
        try:
            rebased = _rebase_refs(params, f"/$defs/{name}")
        except RecursionError:
            raise ValueError(f"the parameters of tool {name!r} nest too deeply") from None
        if rebased == params:  # no local ref: the parameters stay inline
            placed[name] = params
        else:
            defs[name], placed[name] = rebased, {"$ref": f"#/$defs/{name}"}
    return placed, defs


def tool_call_schema(plan: ToolPlan) -> dict[str, Any]:
    """The JSON schema a forced call is generated under."""
    tools = [t for t in plan.tools if plan.forced_name in (None, t.function.name)]
    params, defs = _placed_parameters(tools)
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": params[t.function.name],
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "$defs": defs} if defs else schema


def auto_call_grammar(plan: ToolPlan, parallel: bool) -> str:
    """The Lark grammar (llguidance's dialect) of a reply under tool_choice "auto": free text
    that does not open a call, or a call that parses under the rule above."""
    params, defs = _placed_parameters(plan.tools)
    one = [
        {
            "type": "object",
            "properties": {"name": {"const": t.function.name}, key: params[t.function.name]},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for t in plan.tools
        for key in ("arguments", "parameters")
    ]
    calls: dict[str, Any] = {"anyOf": one}
    if parallel:
        calls = {"anyOf": [*one, {"type": "array", "items": {"anyOf": one}, "minItems": 1}]}
    if defs:
        calls["$defs"] = defs
    return "\n".join(
        [
            "%llguidance {}",
            "start: call | TEXT",
            'call: WS? calls | OPEN calls WS? "</tool_call>"',
            f"calls: %json {json.dumps(calls, ensure_ascii=False)}",
            r"WS: /[ \t\n\r]+/",
            # one lexeme with its whitespace: the lexer takes the longest match, and TEXT
            # would outlast a separate WS while "<tool_call" is still to come
            r"OPEN: /[ \t\n\r]*<tool_call>[ \t\n\r]*/",
            r"TEXT: /(.|\n)*/ & ~/[ \t\n\r]*([{\[]|<tool_call>)(.|\n)*/",
        ]
    )


def parse_tool_calls(text: str, names: set[str]) -> list[dict[str, Any]] | None:
    """OpenAI `tool_calls` if `text` is a tool call under the rule above, else None."""
    body = text.strip()
    wrapped = _WRAPPER.match(body)
    if wrapped:
        body = (wrapped.group(1) if wrapped.group(1) is not None else wrapped.group(2)).strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    items = value if isinstance(value, list) and value else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        args = item.get("arguments", item.get("parameters"))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict):
            return None
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": item["name"],
                    "arguments": json.dumps(args, ensure_ascii=False),
                },
            }
        )
    return calls


def could_become_tool_call(text: str) -> bool:
    """While streaming under "auto": can more text still make this a tool call?"""
    body = text.lstrip()
    return (
        not body
        or body[0] in "{[`"
        or body.startswith("<tool_call>")
        or ("<tool_call>".startswith(body))
    )


def render_tool_calls(calls: list[dict[str, Any]]) -> str:
    """An assistant message's tool_calls as the text the model was asked to write;
    ValueError for arguments nested past what Python's JSON reader takes."""
    rendered = []
    for call in calls:
        fn = call["function"]
        try:
            args: Any = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            args = fn["arguments"]
        except RecursionError:
            raise ValueError(f"the arguments of tool call {fn['name']!r} nest too deeply") from None
        rendered.append({"name": fn["name"], "arguments": args})
    try:
        return json.dumps(rendered[0] if len(rendered) == 1 else rendered, ensure_ascii=False)
    except RecursionError:
        raise ValueError("the tool calls' arguments nest too deeply") from None
