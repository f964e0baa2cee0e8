"""Tokenizer: a fast BPE tokenizer plus the model's own chat template, read offline from a
checkpoint directory (tokenizer.json, tokenizer_config.json, optional chat_template.jinja,
generation_config.json), and incremental detokenization safe for UTF-8 split across tokens.

Chat templates render through transformers' own render_jinja_template (its loop controls,
strftime_now, tojson, raise_exception; tools passed in), so a prompt is the text
apply_chat_template gives. Each family's end-of-turn token stops generation even where the
checkpoint's eos_token_id names only its end-of-text token.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as FastTokenizer
from tokenizers.decoders import DecodeStream

log = logging.getLogger("stemma.tokenizer")


def _token_text(tok: Any) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


# End-of-turn tokens of the chat families (Llama 3, ChatML / Qwen, Gemma, Phi-3): each is a
# stop token wherever the vocabulary holds it as a special token.
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>")


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


@dataclass(slots=True)
class ChatRoles:
    """Role prefix/suffix strings derived from the template (what the DSL appends)."""

    roles: dict[str, tuple[str, str]]
    default_system_prompt: str | None
    generation_prompt: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "roles": {k: list(v) for k, v in self.roles.items()},
            "default_system_prompt": self.default_system_prompt,
            "generation_prompt": self.generation_prompt,
        }


class Tokenizer:
    def __init__(self, ckpt_dir: str | Path):
        ckpt_dir = Path(ckpt_dir)
        self._tok = FastTokenizer.from_file(str(ckpt_dir / "tokenizer.json"))
        tcfg = _read_json(ckpt_dir / "tokenizer_config.json")
        mcfg = _read_json(ckpt_dir / "config.json")
        gcfg = _read_json(ckpt_dir / "generation_config.json")
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self._id(_token_text(tcfg.get("bos_token")))
        eos_ids: set[int] = set()
        for cfg in (mcfg, gcfg):
            eos = cfg.get("eos_token_id")
            eos_ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        eos_tok = self._id(_token_text(tcfg.get("eos_token")))
        if eos_tok is not None:
            eos_ids.add(eos_tok)
        special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        eos_ids.update(self._tok.token_to_id(t) for t in END_OF_TURN_TOKENS if t in special)
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)
        # What transformers hands every template: bos_token, eos_token, pad_token, unk_token.
        self.special_tokens = {
            key: text
            for key in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (text := _token_text(tcfg.get(key))) is not None
        }
        self.control_token_ids: frozenset[int] = frozenset(
            tcfg.get("control_token_ids") or [self._tok.token_to_id(s) for s in special]
        )
        template_file = ckpt_dir / "chat_template.jinja"
        self.chat_template: str | None = (
            template_file.read_text() if template_file.exists() else tcfg.get("chat_template")
        )
        self._chat_roles: ChatRoles | None = None
        self._chat_roles_failed = False  # derived once, and logged, when it cannot be

    def set_chat_template(self, template: str) -> None:
        """Replace the checkpoint's template (--chat-template): a file path or the template."""
        path = Path(template).expanduser()
        self.chat_template = path.read_text() if path.is_file() else template
        self._chat_roles, self._chat_roles_failed = None, False

    @property
    def template_takes_tools(self) -> bool:
        """Whether the chat template renders a `tools` list itself."""
        return self.chat_template is not None and "tools" in self.chat_template

    def _id(self, text: str | None) -> int | None:
        return None if text is None else self._tok.token_to_id(text)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text, as transformers' apply_chat_template(tokenize=False) renders it."""
        from transformers.utils.chat_template_utils import render_jinja_template

        if self.chat_template is None:
            raise ValueError("this model has no chat template; send plain text instead")
        [text], _ = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
        )
        return text

    def chat_roles(self) -> ChatRoles | None:
        """The template's role markers, derived on first use; None (logged once) when not
        even a user / assistant exchange renders into readable markers. Never raises: the
        template is the checkpoint's code, and the server must start whatever it does."""
        if self._chat_roles is None and not self._chat_roles_failed and self.chat_template:
            try:
                self._chat_roles = _derive_chat_roles(self.apply_chat_template)
            except Exception as e:  # noqa: BLE001 - any template error: no markers, logged
                self._chat_roles_failed = True
                log.warning(
                    "chat template role markers not derived (%s: %s); programs get no role "
                    "markers from this server", type(e).__name__, e,
                )  # fmt: skip
        return self._chat_roles


def _derive_chat_roles(render: Any) -> ChatRoles:
    """Role markers from renders of sentinel conversations; without a system role for
    templates that refuse or fold a lone system message (Gemma 2 / 3)."""
    try:
        return _derive_with_system(render)
    except Exception as e:  # noqa: BLE001 - the template's own error, or an unreadable render
        log.info("chat template: no system role markers (%s: %s)", type(e).__name__, e)
        return _derive_without_system(render)


def _derive_without_system(render: Any) -> ChatRoles:
    """User and assistant markers only: the user prefix is what the text before a first and
    before a second user message share at their end."""
    b, c, d = "\x01USR\x01", "\x01AST\x01", "\x01USR2\x01"
    convo = [("user", b), ("assistant", c), ("user", d)]
    full = render([{"role": r, "content": t} for r, t in convo], add_generation_prompt=False)
    user_alone = render([{"role": "user", "content": b}], add_generation_prompt=False)
    with_gen = render([{"role": "user", "content": b}], add_generation_prompt=True)
    first, between = user_alone.split(b)[0], full.split(c)[1].split(d)[0]
    shared = 0
    while shared < min(len(first), len(between)) and first[-1 - shared] == between[-1 - shared]:
        shared += 1
    user_prefix = between[len(between) - shared :]
    generation_prompt = with_gen[len(user_alone) :]
    return ChatRoles(
        roles={
            "user": (user_prefix, full.split(d)[1]),
            "assistant": (generation_prompt, between[: len(between) - shared]),
        },
        default_system_prompt=None,
        generation_prompt=generation_prompt,
    )


def _derive_with_system(render: Any) -> ChatRoles:
    """Split renders of sentinel conversations into each role's prefix and suffix."""
    a, b, c, d = "\x01SYS\x01", "\x01USR\x01", "\x01AST\x01", "\x01USR2\x01"
    convo = [("system", a), ("user", b), ("assistant", c), ("user", d)]
    full = render([{"role": r, "content": t} for r, t in convo], add_generation_prompt=False)
    sys_only = render([{"role": "system", "content": a}], add_generation_prompt=False)
    sys_prefix, sys_suffix = sys_only.split(a)
    user_prefix = full.split(a)[1].split(b)[0].removeprefix(sys_suffix)
    user_suffix = full.split(d)[1]
    asst_suffix = full.split(c)[1].split(d)[0].removesuffix(user_prefix)
    user_alone = render([{"role": "user", "content": b}], add_generation_prompt=False)
    with_gen = render([{"role": "user", "content": b}], add_generation_prompt=True)
    generation_prompt = with_gen[len(user_alone) :]
    head = user_alone.split(b)[0].removesuffix(user_prefix)
    default_system = None
    if head.startswith(sys_prefix) and head.endswith(sys_suffix) and head:
        default_system = head[len(sys_prefix) : len(head) - len(sys_suffix)]
    return ChatRoles(
        roles={
            "system": (sys_prefix, sys_suffix),
            "user": (user_prefix, user_suffix),
            "assistant": (generation_prompt, asst_suffix),
        },
        default_system_prompt=default_system,
        generation_prompt=generation_prompt,
    )


@dataclass(slots=True)
class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas; never emits half a UTF-8 character.

    tokenizers' DecodeStream decodes id by id, holding back while the text ends in U+FFFD.
    A push of several ids emits nothing while its last id leaves a character unfinished.
    """

    tokenizer: Tokenizer
    skip_special_tokens: bool = True
    ids: list[int] = field(default_factory=list)
    num_chars: int = 0  # characters emitted so far
    held: str = ""  # decoded by the stream, not emitted yet
    held_from: int = 0  # index of the first id whose text is not emitted yet
    stream: DecodeStream | None = None

    def push(self, new_ids: list[int]) -> str:
        if self.stream is None:
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
        self.ids.extend(new_ids)
        piece = None
        for token_id in new_ids:
            piece = self.stream.step(self.tokenizer._tok, token_id)
            self.held += piece or ""
        if not self.held or piece is None and self._mid_character():
            return ""
        text, self.held, self.held_from = self.held, "", len(self.ids)
        self.num_chars += len(text)
        return text

    def _mid_character(self) -> bool:
        """The ids not emitted yet end inside a character (the last one added no text)."""
        pending = self.tokenizer.decode(self.ids[self.held_from :], self.skip_special_tokens)
        return pending.endswith("\ufffd")

    def flush(self) -> str:
        """Whatever is held back (an incomplete character decodes to U+FFFD)."""
        text = self.tokenizer.decode(self.ids, self.skip_special_tokens)[self.num_chars :]
        self.num_chars += len(text)
        self.held, self.held_from = "", len(self.ids)
        return text
