"""Vocabulary for constrained decoding (each ordinary token id -> the exact bytes it emits), and
the IndexCompiler that builds outlines-core indexes over it in a sandboxed child process.

Built from a byte-level BPE tokenizer (the GPT-2 byte-to-unicode map inverted). EOS and every
special, control or added token are left out, so no regex can ever select them; EOS is added to
masks only in final states. Tokens containing a NUL byte are left out too: NUL is the end marker
matcher.py appends to every pattern, under the extra id `end_marker_id` (= vocab_size).
`fingerprint` is a content hash that keys every grammar cache.
"""

from __future__ import annotations

import hashlib
import json
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ..faults import Faults
from ..tokenizer import Tokenizer


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable unicode character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


_UNICODE_TO_BYTE = {c: b for b, c in gpt2_bytes_to_unicode().items()}


def byte_level_token_bytes(token: str) -> bytes | None:
    """The bytes a byte-level BPE token stands for; None if it is not in the byte alphabet."""
    try:
        return bytes(_UNICODE_TO_BYTE[ch] for ch in token)
    except KeyError:
        return None


@dataclass(slots=True)
class Vocabulary:
    """Token bytes by id (None = never allowed by a grammar), plus the EOS ids."""

    token_bytes: list[bytes | None]  # [vocab_size]
    eos_token_ids: frozenset[int]
    fingerprint: str = ""
    _outlines: Any = field(default=None, repr=False)
    _single_byte_ids: dict[int, int] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.eos_token_ids:
            raise ValueError("a constrained-decoding vocabulary needs at least one EOS token id")
        if not self.fingerprint:
            self.fingerprint = _fingerprint(self.token_bytes, self.eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @property
    def end_marker_id(self) -> int:
        """Id of the NUL end marker in the outlines-core vocabulary; never a model token."""
        return len(self.token_bytes)

    @property
    def primary_eos_id(self) -> int:
        """The EOS id handed to outlines-core (it marks final states with it)."""
        return min(self.eos_token_ids)

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> Vocabulary:
        """Every ordinary byte-level token; added, special and control tokens left out."""
        decoder = type(tokenizer._tok.decoder).__name__
        if decoder != "ByteLevel":
            raise ValueError(
                f"constrained decoding needs a byte-level BPE tokenizer (decoder ByteLevel), "
                f"got decoder {decoder!r}"
            )
        excluded = set(tokenizer.eos_token_ids) | set(tokenizer.control_token_ids)
        excluded |= set(tokenizer._tok.get_added_tokens_decoder())
        size = tokenizer.vocab_size
        token_bytes: list[bytes | None] = [None] * size
        for token, token_id in tokenizer._tok.get_vocab(with_added_tokens=False).items():
            data = byte_level_token_bytes(token)
            if token_id not in excluded and token_id < size and data and b"\0" not in data:
                token_bytes[token_id] = data
        return cls(token_bytes=token_bytes, eos_token_ids=frozenset(tokenizer.eos_token_ids))

    def to_outlines(self) -> Any:
        """The outlines-core Vocabulary (built once): bytes -> ids, plus the end marker."""
        if self._outlines is None:
            from outlines_core import Vocabulary as OutlinesVocabulary

            by_bytes: dict[bytes, list[int]] = {b"\0": [self.end_marker_id]}
            for token_id, data in enumerate(self.token_bytes):
                if data:
                    by_bytes.setdefault(data, []).append(token_id)
            self._outlines = OutlinesVocabulary(self.primary_eos_id, by_bytes)
        return self._outlines

    def to_binary(self) -> bytes:
        """The outlines-core vocabulary serialized (what compile worker processes load)."""
        return self.to_outlines().__reduce__()[1][0]

    def single_byte_ids(self) -> dict[int, int]:
        """byte value -> the id of a token that is exactly that byte (where one exists)."""
        if self._single_byte_ids is None:
            self._single_byte_ids = {}
            for token_id, data in enumerate(self.token_bytes):
                if data is not None and len(data) == 1:
                    self._single_byte_ids.setdefault(data[0], token_id)
        return self._single_byte_ids


def _fingerprint(token_bytes: list[bytes | None], eos_token_ids: frozenset[int]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(sorted(eos_token_ids)).encode())
    for token_id, data in enumerate(token_bytes):
        if data:
            h.update(token_id.to_bytes(4, "little") + len(data).to_bytes(2, "little") + data)
    return h.hexdigest()[:32]


class CompileError(ValueError):
    """A pattern that cannot be compiled within the limits (the message says which)."""


@dataclass(frozen=True, slots=True)
class CompileLimits:
    max_regex_chars: int = 200_000
    timeout_s: float = 20.0
    max_index_bytes: int = 256 << 20  # serialized outlines-core Index
    max_memory_bytes: int = 4 << 30  # address space of a compile worker process


class _WorkerDied(Exception):
    """The compile worker exited mid-compile (IndexCompiler retries once)."""

    def __init__(self, code: int | None, tail: str) -> None:
        super().__init__(code, tail)
        self.code, self.tail = code, tail


# ---- compile worker processes -------------------------------------------------------------
# Frames on the pipes: parent -> child `u32 length + payload`; child -> parent
# `u8 status + u32 length + payload` (status 0: Index bytes, 1: error text).


class IndexCompiler:
    """Builds outlines-core indexes over one vocabulary in a child process.

    The child is started on first use and killed (then restarted on demand) when a compile
    runs past `timeout_s`; its address space is capped at `max_memory_bytes`. A child that
    dies mid-compile is replaced and the compile tried once more, so a worker lost to
    something other than the pattern (killed from outside, a crash) costs no request.
    """

    def __init__(
        self, vocab_binary: bytes, limits: CompileLimits, faults: Faults | None = None
    ) -> None:
        self.vocab_binary, self.limits = vocab_binary, limits
        self.faults = faults or Faults()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    def compile(self, regex: str) -> bytes:
        """The serialized Index for `regex`; CompileError past a limit or on a bad pattern."""
        try:
            return self._compile_once(regex)
        except _WorkerDied:
            pass
        try:
            return self._compile_once(regex)
        except _WorkerDied as died:
            raise CompileError(
                f"compile worker died twice (exit {died.code}); the constraint most likely "
                f"needs more than the {self.limits.max_memory_bytes >> 20} MiB memory limit. "
                f"{died.tail}".strip()
            ) from None

    def _compile_once(self, regex: str) -> bytes:
        try:
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            _write_frame(proc.stdin, regex.encode())
        except BrokenPipeError:  # the child died since its last compile: start a fresh one
            self.kill()
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            _write_frame(proc.stdin, regex.encode())
        # The fault switches act whatever the child has done so far, so that a test's fault
        # fires the same on a fast CPU, where a small compile may already have answered.
        if self.faults.take("compile_kill"):  # dies mid-compile
            proc.send_signal(signal.SIGKILL)
            raise _WorkerDied(*self.kill())
        if self.faults.take("compile_hang"):  # stops answering until the compile timeout
            proc.send_signal(signal.SIGSTOP)
            time.sleep(self.limits.timeout_s)
            answered = False
        else:
            answered = bool(select.select([proc.stdout], [], [], self.limits.timeout_s)[0])
        if not answered:
            self.kill()
            raise CompileError(
                f"compiling the constraint took longer than the {self.limits.timeout_s:g} s "
                "limit (bounded repetitions such as maxLength/maxItems blow up the automaton)"
            )
        header = _read_exact(proc.stdout, 5)
        if header is None:
            raise _WorkerDied(*self.kill())
        status, length = struct.unpack("<BI", header)
        payload = _read_exact(proc.stdout, length) or b""
        if status:
            raise CompileError(payload.decode())
        return payload

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            self._stderr = tempfile.TemporaryFile()
            # This module's own dotted name, so a move cannot leave the child importing a ghost.
            code = f"from {__name__} import serve_compiles; serve_compiles()"
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                bufsize=0,
            )
            assert self._proc.stdin is not None
            limits = struct.pack("<QQ", self.limits.max_memory_bytes, self.limits.max_index_bytes)
            _write_frame(self._proc.stdin, limits)
            _write_frame(self._proc.stdin, self.vocab_binary)
        return self._proc

    def kill(self) -> tuple[int | None, str]:
        """Stop the worker; its exit code and the tail of its stderr."""
        if self._proc is None:
            return None, ""
        self._proc.kill()
        code = self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()
        self._stderr.seek(0)
        tail = self._stderr.read()[-300:].decode(errors="replace").strip()
        self._stderr.close()
        self._proc = None
        return code, tail


def _write_frame(pipe: BinaryIO, payload: bytes) -> None:
    pipe.write(struct.pack("<I", len(payload)) + payload)
    pipe.flush()


def _read_exact(pipe: BinaryIO, n: int) -> bytes | None:
    chunks, remaining = [], n
    while remaining:
        chunk = pipe.read(remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def serve_compiles() -> None:
    """Child process main: read patterns from stdin, answer Index bytes or an error."""
    import resource

    from outlines_core import Index
    from outlines_core import Vocabulary as OutlinesVocabulary

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    header = _read_exact(stdin, 4)
    limits = _read_exact(stdin, struct.unpack("<I", header)[0]) if header else None
    max_memory, max_index_bytes = struct.unpack("<QQ", limits or bytes(16))
    resource.setrlimit(resource.RLIMIT_AS, (max_memory, max_memory))
    size = struct.unpack("<I", _read_exact(stdin, 4) or bytes(4))[0]
    vocab = OutlinesVocabulary.from_binary(_read_exact(stdin, size))
    while (header := _read_exact(stdin, 4)) is not None:
        regex = (_read_exact(stdin, struct.unpack("<I", header)[0]) or b"").decode()
        try:
            data = Index(regex, vocab).__reduce__()[1][0]
            status, payload = 0, data
            if len(data) > max_index_bytes:
                status = 1
                payload = (
                    f"the compiled constraint takes {len(data) >> 20} MiB, over the limit of "
                    f"{max_index_bytes >> 20} MiB"
                ).encode()
        except ValueError as err:
            status, payload = 1, f"the outlines backend cannot compile the pattern: {err}".encode()
        stdout.write(struct.pack("<BI", status, len(payload)) + payload)
        stdout.flush()
