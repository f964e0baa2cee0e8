"""SGLang's GenerateReqInput fields that stemma's /generate has no use for, so that a body
written for SGLang (or forwarded by `sglang-router`, which adds `model`, `log_metrics`,
`return_hidden_states`, `background`, `no_logs`, `return_bytes`, `return_entropy`, ...) is
accepted when those fields ask for nothing: null or their SGLang default. A field that asks
for something stemma cannot do is a 400 naming it; a field SGLang does not know stays a 400
("unknown field").
"""

from __future__ import annotations

from typing import Any

from .errors import APIError

# Any value is fine: labels and logging switches that change no output.
ANY_VALUE = frozenset(
    {"model", "log_metrics", "no_logs", "custom_labels", "conversation_id", "extra_key",
     "priority", "validation_time", "received_time", "routing_key"}
)  # fmt: skip

# field -> (its default, what a non-default value would ask for)
AT_DEFAULT_ONLY: dict[str, tuple[Any, str]] = {
    "return_hidden_states": (False, "hidden states"),
    "background": (False, "background requests"),
    "return_bytes": (False, "output bytes"),
    "return_entropy": (False, "per-token entropy"),
    "input_embeds": (None, "input embeddings"),
    "image_data": (None, "images (stemma serves text-only models)"),
    "video_data": (None, "video (stemma serves text-only models)"),
    "audio_data": (None, "audio (stemma serves text-only models)"),
    "modalities": (None, "multimodal inputs"),
    "session_params": (None, "sessions"),
    "lora_path": (None, "LoRA adapters"),
    "lora_id": (None, "LoRA adapters"),
    "custom_logit_processor": (None, "custom logit processors"),
    "bootstrap_host": (None, "prefill/decode disaggregation"),
    "bootstrap_port": (None, "prefill/decode disaggregation"),
    "bootstrap_room": (None, "prefill/decode disaggregation"),
    "bootstrap_pair_key": (None, "prefill/decode disaggregation"),
    "data_parallel_rank": (None, "a data-parallel rank inside one server (use the router)"),
    "routed_dp_rank": (None, "a data-parallel rank inside one server (use the router)"),
    "dp_balance_id": (None, "a data-parallel rank inside one server (use the router)"),
    "return_prompt_token_ids": (False, "prompt token ids in the response"),
}


def accept_sglang_fields(extra: dict[str, Any]) -> list[str]:
    """Check the fields of a /generate body beyond stemma's own; returns their names (for
    the caller to drop). APIError 400 names an unknown field or one asking for more."""
    for name, value in extra.items():
        if name in ANY_VALUE:
            continue
        if name not in AT_DEFAULT_ONLY:
            raise APIError(400, f"unknown field {name!r}", name)
        default, asks_for = AT_DEFAULT_ONLY[name]
        if value is not None and value != default:
            raise APIError(
                400, f"{name}={value!r} asks for {asks_for}, which stemma does not support; "
                f"send {default!r} or leave it out", name,
            )  # fmt: skip
    return list(extra)
