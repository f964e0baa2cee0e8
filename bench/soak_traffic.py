"""The soak's traffic: a seeded random mix of requests against `stemma serve`, each checked.

Every scenario sends one kind of request and returns an Outcome: "ok" (a valid answer:
constrained outputs parse and match), "error" (a 4xx/5xx or an aborted request, with a
message, where this scenario may legitimately get one) or "bad" (anything else: an invalid
200, an error without a message, or a normal request failing for no reason the soak caused).
The driver (soak.py) adds "hung" for requests past their deadline.

Errors a normal request may get while the soak injects faults: the message names the fault
("injected fault"), a compile past its time limit, or the server shutting down.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema

from ..lang import RuntimeEndpoint
from .hostile_corpus import hostile_requests
from .soak_corpus import (
    MALFORMED,
    PATHOLOGICAL,
    REGEXES,
    SCHEMAS,
    TOOLS,
    WORDS,
    forked_program,
)

EXPECTED_ERRORS = ("injected fault", "longer than the", "shut down", "aborted")


@dataclass(slots=True)
class Outcome:
    status: str  # "ok" | "error" | "bad"
    detail: str = ""


OK = Outcome("ok")


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _error_message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message") or "")
    return ""


def _http_error(r: httpx.Response, expected: bool) -> Outcome:
    """A non-200: an error with a message; "bad" unless the scenario may get one or the
    message names a cause the soak itself made."""
    try:
        message = _error_message(r.json())
    except ValueError:
        message = ""
    if not message:
        return Outcome("bad", f"HTTP {r.status_code} without an error message: {r.text[:200]}")
    if expected or any(e in message for e in EXPECTED_ERRORS):
        return Outcome("error", f"{r.status_code}: {message[:120]}")
    return Outcome("bad", f"unexpected HTTP {r.status_code}: {message[:200]}")


def _finish(meta: dict[str, Any], expected: bool = False) -> Outcome | None:
    """None when the item finished normally; else the abort as an Outcome."""
    finish = meta.get("finish_reason") or {}
    if finish.get("type") != "abort":
        return None
    message = finish.get("message") or ""
    if message and (expected or any(e in message for e in EXPECTED_ERRORS)):
        return Outcome("error", f"abort: {message[:120]}")
    return Outcome("bad", f"unexpected abort: {message[:200] or '(no message)'}")


def _check_items(
    items: list[dict[str, Any]], check: Callable[[str], str | None], expected: bool = False
) -> Outcome:
    for item in items:
        aborted = _finish(item.get("meta_info", {}), expected)
        if aborted is not None:
            return aborted
        problem = check(item.get("text", ""))
        if problem:
            return Outcome("bad", problem)
    return OK


def _sse_payloads(text: str) -> list[Any]:
    events = []
    for line in text.splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


class Traffic:
    """The scenarios, over one client; `pick` draws one by weight from the seeded rng."""

    def __init__(self, client: httpx.AsyncClient, url: str, rng: random.Random, model: str) -> None:
        self.client, self.url, self.rng, self.model = client, url, rng, model
        self.endpoint = RuntimeEndpoint(url, timeout=120)
        self.counter = 0
        # The soak's server has no API key: the requests that test one are left out.
        self.hostile_cases = [h for h in hostile_requests(model) if h.authorization is None]
        self.scenarios: dict[str, tuple[int, Callable[[], Awaitable[Outcome]]]] = {
            "generate": (10, self.generate),
            "generate_stream": (8, self.generate_stream),
            "generate_batch": (4, self.generate_batch),
            "generate_n": (3, self.generate_n),
            "chat": (8, self.chat),
            "chat_stream": (5, self.chat_stream),
            "regex": (5, self.regex),
            "json_schema": (5, self.json_schema),
            "tool_call": (4, self.tool_call),
            "pathological": (1, self.pathological),
            "hostile": (2, self.hostile),
            "program_fork": (3, self.program_fork),
            "disconnect": (4, self.disconnect),
            "abort": (3, self.abort),
            "flush_cache": (1, self.flush_cache),
            "malformed": (3, self.malformed),
            "over_long": (2, self.over_long),
            "slow_reader": (1, self.slow_reader),
        }

    def pick(self) -> tuple[str, Callable[[], Awaitable[Outcome]]]:
        names = list(self.scenarios)
        weights = [self.scenarios[n][0] for n in names]
        name = self.rng.choices(names, weights)[0]
        return name, self.scenarios[name][1]

    def _sampling(self, max_new: int | None = None) -> dict[str, Any]:
        return {
            "max_new_tokens": max_new or self.rng.randint(1, 64),
            "temperature": self.rng.choice([0.0, 0.0, 0.7, 1.0]),
        }

    async def _post_stream(self, path: str, body: dict[str, Any]) -> list[Any] | Outcome:
        """A whole server-sent-event response's payloads, ending with "[DONE]"."""
        r = await self.client.post(f"{self.url}{path}", json=body)
        if r.status_code != 200:
            return _http_error(r, False)
        events = _sse_payloads(r.text)
        if not events or events[-1] != "[DONE]":
            return Outcome("bad", f"{path} stream did not end with [DONE]")
        return events

    async def _generate(self, body: dict[str, Any], expected: bool = False) -> Any:
        r = await self.client.post(f"{self.url}/generate", json=body)
        return r.json() if r.status_code == 200 else _http_error(r, expected)

    # ---- native /generate ----------------------------------------------------------------
    async def generate(self) -> Outcome:
        params = self._sampling()
        if self.rng.random() < 0.4:  # long decodes outgrow their reservation: retraction
            params |= {"max_new_tokens": self.rng.randint(128, 256), "ignore_eos": True}
        body = {"text": _prompt(self.rng, self.rng.randint(3, 150)), "sampling_params": params}
        out = await self._generate(body)
        return out if isinstance(out, Outcome) else _check_items([out], lambda t: None)

    async def generate_stream(self) -> Outcome:
        body = {
            "text": _prompt(self.rng, self.rng.randint(3, 150)),
            "sampling_params": self._sampling(),
            "stream": True,
        }
        events = await self._post_stream("/generate", body)
        if isinstance(events, Outcome):
            return events
        last = events[-2] if len(events) > 1 else None
        if isinstance(last, dict) and "error" in last:
            return _http_error_event(last)
        if not isinstance(last, dict) or last["meta_info"]["finish_reason"] is None:
            return Outcome("bad", "stream ended without a finish reason")
        return _check_items([last], lambda t: None)

    async def generate_batch(self) -> Outcome:
        texts = [_prompt(self.rng, self.rng.randint(3, 60)) for _ in range(self.rng.randint(2, 4))]
        out = await self._generate({"text": texts, "sampling_params": self._sampling(32)})
        if isinstance(out, Outcome):
            return out
        if not isinstance(out, list) or len(out) != len(texts):
            return Outcome("bad", f"batch of {len(texts)} answered with {type(out).__name__}")
        return _check_items(out, lambda t: None)

    async def generate_n(self) -> Outcome:
        n = self.rng.randint(2, 3)
        params = self._sampling(24) | {"n": n, "temperature": 0.8}
        out = await self._generate({"text": _prompt(self.rng, 20), "sampling_params": params})
        if isinstance(out, Outcome):
            return out
        if not isinstance(out, list) or len(out) != n:
            return Outcome("bad", f"n={n} answered with {len(out) if isinstance(out, list) else 1}")
        return _check_items(out, lambda t: None)

    async def regex(self) -> Outcome:
        pattern = self.rng.choice(REGEXES)
        params = {
            "max_new_tokens": 48,
            "temperature": self.rng.choice([0.0, 0.8]),
            "regex": pattern,
        }
        out = await self._generate({"text": _prompt(self.rng, 10), "sampling_params": params})
        if isinstance(out, Outcome):
            return out
        return _check_items(
            [out], lambda t: None if re.fullmatch(pattern, t) else f"{t!r} !~ {pattern}"
        )

    async def pathological(self) -> Outcome:
        params = {"max_new_tokens": 16} | self.rng.choice(PATHOLOGICAL)
        out = await self._generate({"text": "x", "sampling_params": params}, expected=True)
        return out if isinstance(out, Outcome) else _check_items([out], lambda t: None, True)

    async def hostile(self) -> Outcome:
        """A request that once cost unbounded work: its stated status, errors with a message."""
        case = self.rng.choice(self.hostile_cases)
        r = await self.client.post(f"{self.url}{case.path}", json=case.body)
        if r.status_code not in case.statuses:
            return Outcome("bad", f"hostile {case.name} got HTTP {r.status_code}: {r.text[:200]}")
        if r.status_code != 200:
            return _http_error(r, expected=True)
        items = r.json() if case.path == "/generate" else []
        return _check_items(items if isinstance(items, list) else [items], lambda t: None)

    # ---- OpenAI chat ---------------------------------------------------------------------
    async def _chat(self, extra: dict[str, Any], expected: bool = False) -> Any:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": _prompt(self.rng, self.rng.randint(3, 80))}],
            "max_tokens": self.rng.randint(1, 48),
            "temperature": self.rng.choice([0.0, 0.7]),
        } | extra
        r = await self.client.post(f"{self.url}/v1/chat/completions", json=body)
        return r.json() if r.status_code == 200 else _http_error(r, expected)

    async def chat(self) -> Outcome:
        n = self.rng.choice([1, 1, 2])
        out = await self._chat({"n": n})
        if isinstance(out, Outcome):
            return out
        choices = out.get("choices", [])
        if len(choices) != n or not all(isinstance(c["message"]["content"], str) for c in choices):
            return Outcome("bad", f"chat n={n}: {str(out)[:200]}")
        return OK

    async def chat_stream(self) -> Outcome:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": _prompt(self.rng, 30)}],
            "max_tokens": self.rng.randint(1, 48),
            "stream": True,
        }
        events = await self._post_stream("/v1/chat/completions", body)
        if isinstance(events, Outcome):
            return events
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        if errors:
            return _http_error_event(errors[0])
        finishes = [c.get("finish_reason") for e in events[:-1] for c in e.get("choices", [])]
        return OK if any(finishes) else Outcome("bad", "chat stream without a finish_reason")

    async def json_schema(self) -> Outcome:
        schema = self.rng.choice(SCHEMAS)
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        out = await self._chat({"response_format": fmt, "max_tokens": 96})
        if isinstance(out, Outcome):
            return out
        choice = out["choices"][0]
        if choice["finish_reason"] == "length":
            return Outcome("bad", "a bounded schema ran out of tokens")
        try:
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            return Outcome("bad", f"json_schema output invalid: {e}"[:200])
        return OK

    async def tool_call(self) -> Outcome:
        out = await self._chat({"tools": TOOLS, "tool_choice": "required", "max_tokens": 96})
        if isinstance(out, Outcome):
            return out
        calls = out["choices"][0]["message"].get("tool_calls") or []
        if not calls:
            return Outcome("bad", f"tool_choice=required without a call: {str(out)[:200]}")
        try:
            args = json.loads(calls[0]["function"]["arguments"])
            jsonschema.validate(args, TOOLS[0]["function"]["parameters"])
        except (ValueError, jsonschema.ValidationError) as e:
            return Outcome("bad", f"tool arguments invalid: {e}"[:200])
        return OK

    # ---- programs through RuntimeEndpoint ------------------------------------------------
    async def program_fork(self) -> Outcome:
        topic = self.rng.choice(WORDS)
        try:
            state = await asyncio.to_thread(forked_program.run, topic=topic, backend=self.endpoint)
        except Exception as e:  # noqa: BLE001 - the soak classifies every failure
            message = str(e)
            if any(x in message for x in EXPECTED_ERRORS):
                return Outcome("error", f"program: {message[:120]}")
            return Outcome("bad", f"program failed: {type(e).__name__}: {message[:200]}")
        if state["pick"] not in ("yes", "no") or len(state.ret_value) != 3:
            return Outcome("bad", f"program state wrong: {state.ret_value}")
        return OK

    # ---- hostile clients -----------------------------------------------------------------
    async def _open_stream(self, max_new: int, rid: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {
            "text": _prompt(self.rng, 40),
            "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True},
            "stream": True,
        }
        if rid is not None:
            body["rid"] = rid
        request = self.client.build_request("POST", f"{self.url}/generate", json=body)
        return await self.client.send(request, stream=True)

    async def disconnect(self) -> Outcome:
        r = await self._open_stream(96)
        try:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data:")
                if seen >= self.rng.randint(1, 4):
                    break
        finally:
            await r.aclose()
        return OK

    async def abort(self) -> Outcome:
        self.counter += 1
        rid = f"soak-abort-{self.counter}-{self.rng.randrange(1 << 30)}"
        r = await self._open_stream(96, rid)
        events: list[Any] = []
        try:
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                events.append(data if data == "[DONE]" else json.loads(data))
                if len(events) == 1:
                    await self.client.post(f"{self.url}/abort_request", json={"rid": rid})
        finally:
            await r.aclose()
        if not events or events[-1] != "[DONE]":
            return Outcome("bad", "aborted stream did not end with [DONE]")
        last = events[-2] if len(events) > 1 else {}
        if "error" in last and not any(e in _error_message(last) for e in EXPECTED_ERRORS):
            return Outcome("bad", f"abort error without saying so: {last}")
        return OK

    async def slow_reader(self) -> Outcome:
        r = await self._open_stream(128)
        try:
            await asyncio.sleep(self.rng.uniform(5, 20))  # never read; then hang up
        finally:
            await r.aclose()
        return OK

    async def flush_cache(self) -> Outcome:
        r = await self.client.post(f"{self.url}/flush_cache")
        return OK if r.status_code == 200 else _http_error(r, expected=r.status_code == 409)

    async def malformed(self) -> Outcome:
        path, body = self.rng.choice(MALFORMED)
        kw = {"content": body, "headers": {"content-type": "application/json"}}
        r = await self.client.post(
            f"{self.url}{path}", **(kw if isinstance(body, bytes) else {"json": body})
        )
        if not 400 <= r.status_code < 500:
            return Outcome("bad", f"malformed {path} body got HTTP {r.status_code}")
        return _http_error(r, expected=True)

    async def over_long(self) -> Outcome:
        text = _prompt(self.rng, 12000)  # past the context length
        out = await self._generate({"text": text, "sampling_params": {"max_new_tokens": 4}}, True)
        if not isinstance(out, Outcome) or "context length" not in out.detail:
            return Outcome("bad", f"an over-long prompt was not refused by length: {out}")
        return out


def _http_error_event(event: dict[str, Any]) -> Outcome:
    message = _error_message(event)
    if message and any(e in message for e in EXPECTED_ERRORS):
        return Outcome("error", f"stream error: {message[:120]}")
    return Outcome("bad", f"unexpected stream error: {message[:200] or event}")
