"""Chat requests to engine inputs: messages through the model's chat template (with the tool
prompt when tools are offered), and the one constraint a chat request decodes under
(stemma's regex / json_schema / ebnf extras, response_format, a forced tool call's schema, or
the grammar of a reply that may call a tool).
"""

from __future__ import annotations

import json
from typing import Any

import jinja2

from ...config import EngineConfig
from ...constrained.backend import check_spec
from ...constrained.spec import ConstraintSpec
from ...constrained.structural_tag import structural_tag_grammar
from ..errors import APIError
from ..native import check_constraints, check_json_schema
from ..state import ServerState
from .protocol import ChatCompletionRequest, ChatMessage, ResponseFormat, SamplingFields
from .tools import (
    ToolPlan,
    auto_call_grammar,
    render_tool_calls,
    tool_call_schema,
    tool_system_prompt,
)


def grammar_extras(body: SamplingFields, limits: EngineConfig) -> dict[str, Any]:
    """stemma's regex / json_schema / ebnf extras, checked for the engine's grammar backend
    (off the event loop: it builds them)."""
    fields = (("regex", body.regex), ("json_schema", body.json_schema), ("ebnf", body.ebnf))
    grammar = {k: v for k, v in fields if v is not None}
    check_constraints(grammar, limits, "", limits.grammar_backend, routed=True)
    return grammar


def _message_dict(i: int, m: ChatMessage) -> dict[str, Any]:
    content = (
        m.content
        if isinstance(m.content, str)
        else (None if m.content is None else "".join(part.text for part in m.content))
    )
    if m.tool_calls:
        if m.role != "assistant":
            raise APIError(
                400,
                f"messages[{i}]: only assistant messages carry tool_calls",
                f"messages.{i}.tool_calls",
            )
        try:
            calls = render_tool_calls([c.model_dump() for c in m.tool_calls])
        except ValueError as e:
            raise APIError(400, f"messages[{i}]: {e}", f"messages.{i}.tool_calls") from None
        content = f"{content}\n{calls}" if content else calls
    if content is None:
        raise APIError(400, f"messages[{i}] ({m.role}) has no content", f"messages.{i}.content")
    message = {"role": "system" if m.role == "developer" else m.role, "content": content}
    for key in ("name", "tool_call_id"):
        if getattr(m, key) is not None:
            message[key] = getattr(m, key)
    return message


def chat_prompt(state: ServerState, body: ChatCompletionRequest, plan: ToolPlan) -> list[int]:
    messages = [_message_dict(i, m) for i, m in enumerate(body.messages)]
    tools = None
    if plan.mode != "none" and state.engine.tokenizer.template_takes_tools:
        # The template lays the tools out the way the model was trained to read them.
        tools = [t.model_dump(by_alias=True, exclude_none=True) for t in plan.tools]
    elif plan.mode != "none":
        tools_text = tool_system_prompt(plan)
        if messages[0]["role"] == "system":
            messages[0] = messages[0] | {"content": f"{messages[0]['content']}\n\n{tools_text}"}
        else:
            messages.insert(0, {"role": "system", "content": tools_text})
    try:
        text = state.engine.apply_chat_template(messages, tools=tools)
    except (ValueError, TypeError, jinja2.TemplateError) as e:
        raise APIError(400, f"the chat template rejected the messages: {e}", "messages") from None
    return state.tokenize_prompt(text, "messages")


def chat_grammar(
    body: ChatCompletionRequest, plan: ToolPlan, limits: EngineConfig
) -> dict[str, Any]:
    """At most one constraint: the regex / json_schema extras, response_format, or the
    schema of a forced tool call (each checked: call it off the event loop)."""
    grammar = grammar_extras(body, limits)
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        if grammar:
            raise APIError(
                400,
                "response_format cannot be combined with regex / json_schema",
                "response_format",
            )
        grammar = _format_grammar(fmt, limits)
    if plan.mode == "forced":
        if grammar:
            raise APIError(
                400,
                "a required or named tool_choice cannot be combined with "
                "response_format / regex / json_schema",
                "tool_choice",
            )
        for i, tool in enumerate(plan.tools):
            if tool.function.parameters is not None and limits.grammar_backend == "outlines":
                param = f"tools[{i}].function.parameters"
                check_json_schema(tool.function.parameters, param, limits, routed=True)
        grammar = {"json_schema": tool_call_schema(plan)}  # its bounds: the engine's parser
    if plan.mode == "auto" and not grammar:
        grammar = _auto_grammar(plan, body.parallel_tool_calls is not False)
    return grammar


def _format_grammar(fmt: ResponseFormat, limits: EngineConfig) -> dict[str, Any]:
    """The constraint of a response_format other than text."""
    if fmt.type == "structural_tag":
        tag = {"structures": fmt.structures, "triggers": fmt.triggers}
        try:
            structural_tag_grammar(tag)
        except ValueError as e:
            raise APIError(400, f"response_format: {e}", "response_format") from None
        return {"structural_tag": json.dumps(tag)}
    if fmt.type == "json_schema" and fmt.json_schema is None:
        raise APIError(
            400,
            "response_format json_schema needs a 'json_schema' object",
            "response_format.json_schema",
        )
    schema = (
        fmt.json_schema.schema_
        if fmt.type == "json_schema" and fmt.json_schema and fmt.json_schema.schema_ is not None
        else {"type": "object"}
    )
    check_constraints(
        {"json_schema": schema}, limits, "response_format.", limits.grammar_backend, routed=True
    )
    return {"json_schema": schema}


def _auto_grammar(plan: ToolPlan, parallel: bool) -> dict[str, Any]:
    """A call, once begun, parses (llguidance); where a tool's parameters hold a keyword the
    grammar backend refuses, the reply stays free text, read as a call afterwards if it is one
    (tool_choice "required" or a named tool refuses such parameters with a 400 instead)."""
    spec = ConstraintSpec.create(ebnf=auto_call_grammar(plan, parallel))
    try:
        check_spec("llguidance", spec)
    except ValueError:
        return {}
    return {"ebnf": spec.ebnf}


def chat_max_tokens(body: ChatCompletionRequest) -> tuple[int | None, str]:
    if body.max_completion_tokens is not None:
        if body.max_tokens is not None and body.max_tokens != body.max_completion_tokens:
            raise APIError(400, "max_tokens and max_completion_tokens disagree", "max_tokens")
        return body.max_completion_tokens, "max_completion_tokens"
    return body.max_tokens, "max_tokens"
