"""The command line the examples share: which backend to run on.

Default: the in-process runtime (`stemma.Runtime(model=...)`); `--url` talks to a running server.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from stemma.lang import Backend, RuntimeEndpoint


def parse_args(description: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m", help="model for the in-process runtime")
    parser.add_argument("--url", default=None, help="a running server, e.g. http://127.0.0.1:30000")
    return parser.parse_args(argv)


@contextmanager
def open_backend(args: argparse.Namespace) -> Iterator[Backend]:
    """The backend the arguments name, shut down afterwards if it is in-process."""
    if args.url:
        yield RuntimeEndpoint(args.url)
        return
    import stemma  # the runtime (and torch) load only here

    runtime = stemma.Runtime(model=args.model)
    try:
        yield runtime
    finally:
        shutdown = getattr(runtime, "shutdown", None)
        if shutdown is not None:
            shutdown()
