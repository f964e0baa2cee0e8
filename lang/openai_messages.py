"""How a program's text becomes an OpenAI chat request, and what the chat API cannot express.

The OpenAI backend gives the interpreter ChatML role markers, so a state's text splits back
into exactly the messages the program appended. A gen or select must open an assistant turn:
the chat API continues a conversation, it cannot continue text inside a turn. Sampling fields
map one to one where the API has them; a field it lacks raises ValueError naming the primitive.
"""

from __future__ import annotations

import json
import re
from typing import Any

ROLE_MARKERS = {
    role: [f"<|im_start|>{role}\n", "<|im_end|>\n"] for role in ("system", "user", "assistant")
}
END_MARKER = "<|im_end|>"
_MESSAGE = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)<\|im_end\|>\n", re.DOTALL)
_OPEN_ASSISTANT = "<|im_start|>assistant\n"

# SamplingParams field -> the chat API's field, for every server.
_COMMON_FIELDS = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "n": "n",
}
# Extras that stemma / SGLang and llama.cpp's server both take under these names.
_EXTRA_FIELDS = {"top_k": "top_k", "min_p": "min_p", "ignore_eos": "ignore_eos"}


def split_messages(text: str, primitive: str) -> list[dict[str, str]]:
    """The messages of `text`, which must end by opening an empty assistant turn."""
    messages, pos = [], 0
    for match in _MESSAGE.finditer(text):
        if match.start() != pos:
            break
        messages.append({"role": match.group(1), "content": match.group(2)})
        pos = match.end()
    rest = text[pos:]
    if rest == _OPEN_ASSISTANT:
        return messages
    if rest.startswith(_OPEN_ASSISTANT):
        raise ValueError(
            f"{primitive} after text inside an assistant turn ({rest[len(_OPEN_ASSISTANT) :]!r})"
            " cannot be expressed over the OpenAI chat API: put the gen first in the turn"
        )
    raise ValueError(
        f"{primitive} outside an assistant turn cannot be expressed over the OpenAI chat API:"
        f" write s += assistant({primitive}(...)) (text after the last message: {rest[:60]!r})"
    )


def chat_body(
    model: str, messages: list[dict[str, str]], params: dict[str, Any], grammar: str | None
) -> dict[str, Any]:
    """The /v1/chat/completions body for one gen's sampling params under dialect `grammar`."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    extras = _EXTRA_FIELDS if grammar is not None else {}
    for name, value in params.items():
        if value is None:
            continue
        if name in _COMMON_FIELDS:
            body[_COMMON_FIELDS[name]] = value
        elif name in extras:
            body[extras[name]] = value
        elif name == "stop":
            stops = [value] if isinstance(value, str) else list(value)
            stops = [s for s in stops if s != END_MARKER]  # the server ends turns by itself
            if stops:
                body["stop"] = stops
        elif name == "json_schema":
            schema = json.loads(value) if isinstance(value, str) else value
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema},
            }
        elif name == "regex":
            body.update(regex_fields(value, grammar))
        elif name == "ebnf":
            body.update(ebnf_fields(value, grammar))
        else:
            raise ValueError(f"gen({name}=...) cannot be expressed over the OpenAI chat API")
    return body


def regex_fields(pattern: str, grammar: str | None) -> dict[str, Any]:
    """A regex constraint in the server's own request field."""
    if grammar == "regex":
        return {"regex": pattern}
    if grammar == "gbnf":
        raise ValueError(
            "gen(regex=...) (also dtype=int/float/bool) cannot be expressed on this server: "
            "it takes GBNF grammars and JSON schemas, not regexes; use json_schema=... or select"
        )
    raise ValueError(
        "gen(regex=...) cannot be expressed over the plain OpenAI API (only response_format "
        "JSON schemas); use json_schema=..., or a server with a regex field (stemma, SGLang)"
    )


def ebnf_fields(grammar_text: str, grammar: str | None) -> dict[str, Any]:
    """A GBNF grammar in the server's own field: `ebnf` (stemma, SGLang), `grammar` (llama.cpp)."""
    if grammar == "regex":
        return {"ebnf": grammar_text}
    if grammar == "gbnf":
        return {"grammar": grammar_text}
    raise ValueError(
        "gen(ebnf=...) cannot be expressed over the plain OpenAI API (only response_format "
        "JSON schemas); use a server with a grammar field (stemma, SGLang, llama.cpp)"
    )


def choices_fields(choices: list[str], grammar: str | None) -> dict[str, Any]:
    """Constrain a completion to exactly one of `choices` in the server's grammar field."""
    if grammar == "regex":
        return {"regex": "(" + "|".join(re.escape(c) for c in choices) + ")"}
    if grammar == "gbnf":
        return {"grammar": "root ::= " + " | ".join(json.dumps(c) for c in choices)}
    raise ValueError(f"no grammar field for dialect {grammar!r}")


def match_top_logprobs(choices: list[str], top: list[dict[str, Any]]) -> tuple[str, float] | None:
    """The choice that the most likely first token begins (by its logprob), if any does."""
    best: tuple[str, float] | None = None
    for entry in top:
        token = str(entry.get("token", ""))
        for choice in choices:
            if token.strip() and choice.startswith(token.lstrip()):
                if best is None or entry["logprob"] > best[1]:
                    best = (choice, float(entry["logprob"]))
                break
    return best


def response_dict(
    payload: dict[str, Any], choice: dict[str, Any], text: str, latency: float
) -> dict[str, Any]:
    """A /generate-shaped response from a chat completion (or its last stream chunk)."""
    usage = payload.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if cached is None:  # llama.cpp reports its prompt cache in `timings`
        cached = (payload.get("timings") or {}).get("cache_n")
    finish = choice.get("finish_reason") or "stop"
    meta: dict[str, Any] = {
        "id": payload.get("id", ""),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": cached,
        "finish_reason": {"type": "length" if finish == "length" else "stop", "matched": None},
        "e2e_latency": latency,
    }
    logprobs = (choice.get("logprobs") or {}).get("content")
    if logprobs:
        meta["output_token_logprobs"] = [[e["logprob"], None, e["token"]] for e in logprobs]
    return {"text": text, "output_ids": [], "meta_info": meta}
