"""Tool-calling agent: tools are described in the system prompt, the model's call is generated
under a JSON schema, the tool runs in Python, its result is fed back, and the model answers.

    python -m stemma.examples.tool_call_agent [--model smollm2-135m | --url http://HOST:PORT]
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from typing import Any

from stemma.lang import Backend, assistant, function, gen, system, user

from .cli import open_backend, parse_args

QUESTION = "What is 12 times 7?"
CAPITALS = {"france": "Paris", "japan": "Tokyo", "kenya": "Nairobi", "peru": "Lima"}
_BINARY_OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def calculator(expression: str) -> str:
    """Evaluate + - * / over numbers (parsed with ast, never eval'd)."""

    def value(node: ast.expr) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            return _BINARY_OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"unsupported expression {expression!r}")

    return f"{value(ast.parse(expression, mode='eval').body):g}"


def capital(country: str) -> str:
    return CAPITALS.get(country.strip().lower(), f"unknown country {country!r}")


TOOLS: dict[str, tuple[Callable[[str], str], str]] = {
    "calculator": (calculator, "evaluates arithmetic, e.g. 12 * (3 + 4)"),
    "capital": (capital, "gives the capital city of a country, e.g. France"),
}
CALL_SCHEMA = {
    "type": "object",
    "properties": {
        "tool": {"type": "string", "enum": list(TOOLS)},
        "argument": {"type": "string", "maxLength": 40},
    },
    "required": ["tool", "argument"],
    "additionalProperties": False,
}


def run_tool(tool: str, argument: str) -> str:
    """The tool's result, or the error the model should see instead."""
    if tool not in TOOLS:
        return f"error: unknown tool {tool!r}"
    try:
        return TOOLS[tool][0](argument)
    except (ValueError, SyntaxError, ZeroDivisionError) as err:
        return f"error: {err}"


@function
def tool_agent(s, question: str) -> None:
    tool_list = "\n".join(f"- {name}: {doc}" for name, (_, doc) in TOOLS.items())
    s += system(
        f"You can call one tool.\nTools:\n{tool_list}\n"
        'Reply with JSON only, like {"tool": "calculator", "argument": "2 + 2"}.'
    )
    s += user(question)
    s += assistant(gen("call", max_tokens=64, json_schema=CALL_SCHEMA, temperature=0.0))
    call = json.loads(s["call"])
    s["result"] = run_tool(call["tool"], call["argument"])
    s += user(f"The tool returned: {s['result']}\nAnswer the question in one sentence.")
    s += assistant(gen("answer", max_tokens=64, temperature=0.0))


def workload(num: int) -> list[dict[str, Any]]:
    """`num` questions, alternating arithmetic and capitals."""
    countries = [name.capitalize() for name in CAPITALS]
    return [
        {"question": f"What is {12 + i} times {7 + i % 5}?"}
        if i % 2 == 0
        else {"question": f"What is the capital city of {countries[(i // 2) % 4]}? ({i})"}
        for i in range(num)
    ]


PROGRAM = tool_agent


def run_example(backend: Backend, question: str = QUESTION) -> dict[str, Any]:
    state = tool_agent.run(question=question, backend=backend)
    return {"call": json.loads(state["call"]), "result": state["result"], "answer": state["answer"]}


def main(argv: list[str] | None = None) -> None:
    with open_backend(parse_args(__doc__, argv)) as backend:
        result = run_example(backend)
    print(f"question: {QUESTION}")
    print(f"tool call: {json.dumps(result['call'])}")
    print(f"tool result: {result['result']}")
    print(f"answer: {result['answer']}")


if __name__ == "__main__":
    main()
