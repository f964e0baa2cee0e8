"""`python -m stemma` / `stemma`: the command line.

stemma demo [--model M]          run the branching-agent example on the built-in model
stemma generate "prompt" [...]   one chat completion, printed
stemma serve [options]           the HTTP server (SGLang /generate + OpenAI API)
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from .examples import branching_agent

        branching_agent.main(rest)
        return 0
    if command == "generate":
        return _generate(rest)
    if command == "serve":
        from .runtime.server.app import main as serve

        return serve(rest)
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


def _generate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stemma generate")
    parser.add_argument("prompt")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    from .runtime.engine import Engine

    with Engine(args.model) as engine:
        text = engine.apply_chat_template([{"role": "user", "content": args.prompt}])
        out = engine.generate(
            text, {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
        )
    print(out["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
