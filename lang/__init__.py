"""The stemma DSL: programs, interpreter and backends (standard library only)."""

from .backend import (
    Backend,
    BackendError,
    flush_cache,
    get_default_backend,
    set_default_backend,
)
from .chat_template import ChatTemplate
from .choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from .endpoint import RuntimeEndpoint
from .ir import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from .openai_backend import OpenAI
from .program import Program, function
from .sampling import SamplingParams
from .state import ProgramState, ProgramStateGroup


def fork(state: ProgramState, n: int) -> ProgramStateGroup:
    """`state.fork(n)`: n branches sharing `state`'s text."""
    return state.fork(n)


__all__: list[str] = [
    "Backend",
    "BackendError",
    "ChatTemplate",
    "ChoicesDecision",
    "ChoicesSamplingMethod",
    "OpenAI",
    "Program",
    "ProgramState",
    "ProgramStateGroup",
    "RuntimeEndpoint",
    "SamplingParams",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "fork",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "greedy_token_selection",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
]
