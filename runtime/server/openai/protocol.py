"""OpenAI request models (pydantic, strict): /v1/completions and /v1/chat/completions.

Unknown fields and wrong JSON types are 400s naming the field. Fields OpenAI defines that
stemma has no use for are accepted only where clients send them by default (`user`,
`metadata`, `store`, and the null-valued fields SDK message objects carry). stemma's extras
(top_k, min_p, repetition_penalty, regex, json_schema, ignore_eos, ...) sit beside them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

STRICT = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
MAX_N = 64


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class SamplingFields(BaseModel):
    """What both endpoints share: the model name, sampling, streaming, stemma's extras."""

    model_config = STRICT
    model: str | None = Field(None, description="Defaults to the served model")
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=0, description="Default: the rest of the context")
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    # stemma extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None  # SGLang's: a GBNF grammar
    close_early: bool | None = None  # stemma's: end valid within max_tokens (on for schemas)
    property_order: str | None = None  # stemma's: a schema's keys in "schema" or "any" order
    cache_salt: str | None = None  # vLLM's: prefix cache shared only with the same salt


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: str | None = None


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = STRICT
    name: str
    arguments: str = Field(description="JSON text of the arguments")


class ToolCall(BaseModel):
    model_config = STRICT
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # carried by SDK message objects sent back as history; must be null
    refusal: None = None
    audio: None = None
    function_call: None = None
    annotations: list[Any] | None = None


class FunctionDef(BaseModel):
    model_config = STRICT
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON schema (an object)")
    strict: bool | None = None


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # SGLang's structural_tag: tagged structures in free text (constrained/structural_tag.py)
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
