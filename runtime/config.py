"""EngineConfig: every engine option in one frozen, validated dataclass (the CLI mirrors it)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..lang.sampling_table import GRAMMAR_BACKENDS  # one table of grammar backends
from .weight_plan import QUANTIZATION_METHODS, QUANTIZATION_NONE  # names live with the plan

DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16", "float64")
SPECULATIVE_ALGORITHMS = (None, "NGRAM")
MAX_DRAFT_TOKENS = 64  # one draft's tokens, well inside a matcher's rollback window (1024)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = "smollm2-135m"
    dtype: str = "auto"  # see runtime/dtype_policy.py: bfloat16 only where it is native
    device: str = "cpu"
    # QUANTIZATION_METHODS (CPU), or "none": dequantized; None (default) leaves a quantized
    # GGUF's own 4-bit blocks to dtype "auto"'s measured plan (runtime/weight_plan.py)
    quantization: str | None = None
    attention_backend: str = "auto"  # torch on CPU, triton on CUDA
    kv_cache_mb: int = 512  # memory budget for the KV pool
    max_total_tokens: int | None = None  # KV slots; overrides kv_cache_mb when set
    page_size: int = 1
    max_running_requests: int = 64
    context_length: int | None = None  # default: the model's max_position
    chunked_prefill_size: int = 512  # most prompt tokens one request prefills per step
    max_prefill_tokens: int = 2048  # most prompt tokens in one step
    disable_radix_cache: bool = False
    enable_jump_forward: bool = True  # append text a constraint forces without a forward
    # Speculative decoding (scheduler/speculative.py), SGLang's flags: NGRAM drafts by prompt
    # lookup; num_draft_tokens counts the sampled token too (at most num - 1 drafted).
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int = 8
    # The decode step compiled whole by Inductor (executor/compiled.py), SGLang's flags; for
    # decode batches of at most torch_compile_max_bs requests.
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 64
    # With it, one-row steps, a few requests' decode steps and one request's drafts run
    # AOTInductor packages (executor/compiled_aot.py: no Dynamo guards or Python between
    # kernels, one more copy of the weights each); off, Dynamo's graph.
    torch_compile_aot: bool = True
    grammar_backend: str = "outlines"  # outlines | llguidance (runtime/constrained/backend.py)
    grammar_timeout_s: float = 20.0  # a constraint compiling longer fails its request
    grammar_max_index_mb: int = 256  # a compiled constraint larger than this fails its request
    # Bounds on one /generate request, checked before any work is spent on it (io_struct.py).
    max_request_items: int = 1024  # prompts x n (vLLM: 1024 prompts)
    max_top_logprobs: int = 20  # top_logprobs_num (vLLM's max_logprobs)
    max_stop_strings: int = 32  # stop strings and stop regexes together
    max_stop_chars: int = 1024  # characters in one stop string or stop regex
    max_stop_regex_states: int = 4096  # a request's stop regexes' automaton states, together
    max_prompt_chars: int = 1 << 20  # characters of one text prompt, before tokenizing
    max_constraint_chars: int = 1 << 18  # characters of a regex / json_schema / ebnf (real-world
    # schemas reach 150k: Kubernetes, JSONSchemaStore)
    max_queued_requests: int = 4096  # waiting requests; past it a new request is refused (429)
    max_schema_depth: int = 64  # nesting of a json_schema document (objects and lists)
    max_schema_regex_chars: int = 1 << 19  # a json_schema's regex, estimated before building
    schedule_policy: str = "lpm"  # lpm (longest prefix match) | fcfs
    cache_dir: str | None = None  # converted checkpoints; default ~/.cache/stemma
    chat_template: str | None = None  # a Jinja file or template replacing the checkpoint's
    random_seed: int = 0
    num_threads: int | None = None  # torch CPU threads; None leaves torch's default
    enable_fault_injection: bool = False  # test-only switches (runtime/faults.py)
    # Tensor parallelism (runtime/executor/tensor_parallel.py); SGLang's flag names.
    tp_size: int = 1  # ranks; the engine's process is rank 0, the others are spawned workers
    dist_init_addr: str | None = None  # HOST:PORT of rank 0's rendezvous; default loopback
    nnodes: int = 1  # machines sharing the tp_size ranks
    node_rank: int = 0  # this machine's place among them (0 runs the engine)
    dist_timeout_s: float = 5.0  # a collective waiting longer fails: a rank died or hung
    dist_connect_timeout_s: float = 300.0  # how long the other nodes' ranks may take to join
    dist_secret_file: str | None = None  # the step messages' HMAC key; executor/tp_auth.py

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")
        if self.quantization is not None:
            allowed = (*QUANTIZATION_METHODS, QUANTIZATION_NONE)
            if self.quantization not in allowed:
                got = self.quantization
                raise ValueError(f"quantization must be one of {allowed}, got {got!r}")
            if self.device != "cpu" and self.quantization != QUANTIZATION_NONE:
                raise ValueError(
                    f"quantization {self.quantization!r} uses torch's packed CPU kernels; "
                    f"device {self.device!r} runs without quantization"
                )
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"attention_backend must be 'auto', 'torch' or 'triton', "
                f"got {self.attention_backend!r}"
            )
        if self.schedule_policy not in ("lpm", "fcfs"):
            raise ValueError(
                f"schedule_policy must be 'lpm' or 'fcfs', got {self.schedule_policy!r}"
            )
        positive = (
            "kv_cache_mb",
            "page_size",
            "max_running_requests",
            "chunked_prefill_size",
            "max_prefill_tokens",
            "max_request_items",
            "max_stop_strings",
            "max_stop_chars",
            "max_stop_regex_states",
            "max_prompt_chars",
            "max_constraint_chars",
            "max_queued_requests",
            "max_schema_depth",
            "max_schema_regex_chars",
            "torch_compile_max_bs",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_top_logprobs < 0:
            raise ValueError(f"max_top_logprobs must be >= 0, got {self.max_top_logprobs}")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(
                f"grammar_backend must be one of {GRAMMAR_BACKENDS}, got {self.grammar_backend!r}"
            )
        if self.speculative_algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(
                f"speculative_algorithm must be one of {SPECULATIVE_ALGORITHMS} (drafts without "
                f"a draft model), got {self.speculative_algorithm!r}"
            )
        if not 2 <= self.speculative_num_draft_tokens <= MAX_DRAFT_TOKENS + 1:
            raise ValueError(
                f"speculative_num_draft_tokens must be in [2, {MAX_DRAFT_TOKENS + 1}] (the "
                f"sampled token and at least one draft), got {self.speculative_num_draft_tokens}"
            )
        if self.grammar_timeout_s <= 0 or self.grammar_max_index_mb < 1:
            raise ValueError("grammar_timeout_s must be > 0 and grammar_max_index_mb >= 1")
        self._check_parallel()
        for name in ("max_total_tokens", "context_length", "num_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 when set, got {value}")
        if self.chunked_prefill_size % self.page_size:
            raise ValueError("chunked_prefill_size must be a multiple of page_size")

    def _check_parallel(self) -> None:
        if self.tp_size < 1 or self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"need tp_size >= 1, nnodes >= 1 and 0 <= node_rank < nnodes; got tp_size="
                f"{self.tp_size}, nnodes={self.nnodes}, node_rank={self.node_rank}"
            )
        if self.tp_size % self.nnodes:
            raise ValueError(f"nnodes={self.nnodes} does not divide tp_size={self.tp_size}")
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise ValueError(
                f"nnodes={self.nnodes} needs dist_init_addr HOST:PORT: node 0's address and a "
                f"free port that every node reaches"
            )
        if self.dist_timeout_s <= 0 or self.dist_connect_timeout_s <= 0:
            raise ValueError(
                f"dist_timeout_s and dist_connect_timeout_s must be > 0, got "
                f"{self.dist_timeout_s} and {self.dist_connect_timeout_s}"
            )
        if self.tp_size > 1 and self.enable_torch_compile:
            raise ValueError("enable_torch_compile with tp_size > 1 is not supported")
        if self.tp_size > 1 and self.quantization not in (None, QUANTIZATION_NONE):
            raise ValueError("quantization with tp_size > 1 is not supported")

    @property
    def resolved_attention_backend(self) -> str:
        if self.attention_backend != "auto":
            return self.attention_backend
        return "triton" if self.device.startswith("cuda") else "torch"

    @staticmethod
    def from_kwargs(**kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return EngineConfig(**kwargs)
