"""Chat templates by name and by model path, for servers that do not send their template.

An SGLang server's /get_model_info has no chat template, so a client picks one itself, as
SGLang's own RuntimeEndpoint does: by `chat_template_name`, else by matching the model path
(the first matching rule wins; no match gives "default"). Only templates whose roles are plain
prefix/suffix markers are listed. Markers follow SGLang's registry of the same names.
"""

from __future__ import annotations

import re

from .chat_template import ChatTemplate

_CHATML = {
    "system": ("<|im_start|>system\n", "<|im_end|>\n"),
    "user": ("<|im_start|>user\n", "<|im_end|>\n"),
    "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n"),
}

NAMED_TEMPLATES: dict[str, ChatTemplate] = {
    "default": ChatTemplate(
        {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"), "assistant": ("ASSISTANT:", "\n")}
    ),
    "chatml": ChatTemplate(_CHATML),
    "qwen": ChatTemplate(_CHATML, "You are a helpful assistant."),
    "llama-3-instruct": ChatTemplate(
        {
            role: (f"<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>")
            for role in ("system", "user", "assistant")
        }
    ),
    "mistral": ChatTemplate(
        {
            "system": ("[SYSTEM_PROMPT] ", " [/SYSTEM_PROMPT]"),
            "user": ("[INST] ", " [/INST]"),
            "assistant": ("", " </s><s>"),
        }
    ),
    "gemma-it": ChatTemplate(
        {
            "system": ("", ""),
            "user": ("<start_of_turn>user\n", "<end_of_turn>\n"),
            "assistant": ("<start_of_turn>model\n", "<end_of_turn>\n"),
        }
    ),
}

# (pattern searched case-insensitively in the model path, template name), in SGLang's order.
_PATH_RULES: list[tuple[str, str]] = [
    (r"(mistral|mixtral).*instruct", "mistral"),
    (r"llama-3.*instruct", "llama-3-instruct"),
    (r"tinyllama", "chatml"),
    (r"qwen.*(chat|instruct)", "qwen"),
    (r"(gemma.*it)|(gemma-3)", "gemma-it"),
]


def template_by_name(name: str) -> ChatTemplate:
    """The template registered as `name`."""
    if name not in NAMED_TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; known: {sorted(NAMED_TEMPLATES)}")
    return NAMED_TEMPLATES[name]


def template_name_for_model_path(model_path: str) -> str:
    """The name of the template a model path implies ("default" when no rule matches)."""
    for pattern, name in _PATH_RULES:
        if re.search(pattern, model_path, re.IGNORECASE):
            return name
    return "default"
