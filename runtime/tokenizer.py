"""Tokenizer: a fast BPE tokenizer plus the model's own chat template, read offline from a
checkpoint directory (tokenizer.json, tokenizer_config.json, optional chat_template.jinja,
generation_config.json), and incremental detokenization safe for UTF-8 split across tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as FastTokenizer
from tokenizers.decoders import DecodeStream


def _token_text(tok: Any) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


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
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)
        special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        self.control_token_ids: frozenset[int] = frozenset(
            tcfg.get("control_token_ids") or [self._tok.token_to_id(s) for s in special]
        )
        template_file = ckpt_dir / "chat_template.jinja"
        self.chat_template: str | None = (
            template_file.read_text() if template_file.exists() else tcfg.get("chat_template")
        )
        self._compiled_template: Any = None
        self._chat_roles: ChatRoles | None = None

    def _id(self, text: str | None) -> int | None:
        return None if text is None else self._tok.token_to_id(text)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        if self.chat_template is None:
            raise ValueError("this model has no chat template; send plain text instead")
        if self._compiled_template is None:
            self._compiled_template = _compile_template(self.chat_template)
        return self._compiled_template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else "",
            eos_token="",
        )

    def chat_roles(self) -> ChatRoles:
        if self._chat_roles is None:
            self._chat_roles = _derive_chat_roles(self.apply_chat_template)
        return self._chat_roles


def _compile_template(source: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    return env.from_string(source)


def _derive_chat_roles(render: Any) -> ChatRoles:
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
