"""stemma: structured-generation programs for LLM agents on a RadixAttention runtime.

`import stemma` stays light (no torch): the runtime classes load on first use.
"""

# The DSL is the public surface. Imported absolutely, so that a checkout in a folder of any
# name runs its tests: pytest imports the root `__init__.py` as a package named after it.
from stemma.lang import *  # noqa: F403
from stemma.lang import __all__ as _lang_all

__version__ = "0.1.0"

_RUNTIME_EXPORTS = {
    "Constraint": "stemma.runtime.constraint",
    "Engine": "stemma.runtime.engine",
    "EngineConfig": "stemma.runtime.config",
    "Runtime": "stemma.runtime.inprocess",
}

__all__ = [*_lang_all, *_RUNTIME_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _RUNTIME_EXPORTS:
        import importlib

        return getattr(importlib.import_module(_RUNTIME_EXPORTS[name]), name)
    raise AttributeError(f"module 'stemma' has no attribute {name!r}")
