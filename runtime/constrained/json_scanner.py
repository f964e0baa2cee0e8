"""`JsonScanner`: where an output's bytes stand as JSON (a grammar keeps them valid), and whether
they break `uniqueItems` (unique_items.py) or an object's `KeyRule` (property_order.py).

It keeps the instance path of every open container; for each array that must hold unique items,
the items seen so far; for each object with a key rule, its keys so far. An item counts once it
cannot grow: a string at its closing quote, a container at its closing bracket, a literal at its
last letter, a number at the byte after it; `feed` fails at the byte that completes a repeat. A
key fails at its closing quote when it repeats one or leaves no room under maxProperties for the
required keys still missing, and at any byte after which no allowed key can begin with it (a
closed object's names); the closing brace fails while a required key is missing or minProperties
is not reached. A rule that holds only where a discriminator's value (or key) chooses its branch
(`ObjectKeys.conditional`) is checked at the closing brace where the value is known by then;
where it is not (the value comes after the inner object), the broken rule waits on the outer
object, and the value's last byte (or the key's closing quote) fails if it is one that chooses
the rule, as does that object's closing brace if a discriminating value's key never came (every
instance there has it); a discriminating key that never came chooses nothing. A `trial_copy`
records its items apart, so trying a token changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from .instance_paths import Condition, canonical
from .json_frame import Frame
from .key_presence import holds, satisfiable
from .property_order import ObjectKeys
from .unique_items import UniqueArrays

_LITERALS = (b"true", b"false", b"null")
_NUMBER = frozenset(b"0123456789.eE+-")
_SPACE = frozenset(b" \t\n\r")
# scanner states
VALUE, KEY_START, KEY, COLON, STRING, NUMBER, LITERAL, AFTER = range(8)


class JsonScanner:
    """Where the JSON bytes so far stand; `feed` returns False at a repeated unique item."""

    def __init__(self, arrays: UniqueArrays, keys: ObjectKeys | None = None) -> None:
        self.arrays, self.keys = arrays, keys
        self.stack: list[Frame] = []
        self.state, self.escape, self.word, self.word_start = VALUE, False, b"", 0
        self.text = bytearray()
        self.trial = False  # a copy: items go to `tried`, never to `seen`

    @property
    def watching(self) -> bool:
        """A token may break a rule: some open container is a unique array or an object with
        a key rule, or, outside a string, one token may open and close one (`{}`, `[1,1]`)."""
        return self.inside_watched or (
            not self.in_string and (self.keys is not None or bool(self.arrays.paths))
        )

    def structural_only(self) -> bool:
        """Outside strings, only a token with a quote, a comma or a closing bracket can fail
        now: no unique array is open (whose items end at any byte after them) and no value
        whose key a condition watches is under way (nor about to begin)."""
        if any(f.unique for f in self.stack):
            return False
        top = self.stack[-1] if self.stack else None
        return top is None or top.is_array or top.at not in top.watch or self.state == AFTER

    def quote_ends_quietly(self) -> bool:
        """In a string, its closing quote (and a colon after a key's) cannot fail: a value
        (`structural_only` holding), or a key of an object that refuses a new key only when it
        repeats one (no closed names, maxProperties, formula or condition waiting on its keys,
        no watched key), which only a token that writes what is left of an earlier key can."""
        top = self.stack[-1]
        if self.escape:  # the next quote is written, not the end
            return False
        if self.state == STRING:
            return True
        rule = top.rule
        return rule is None or (
            rule.names is None
            and rule.max_count is None
            and rule.formula is None
            and not top.pending
            and not top.watch
        )

    @property
    def inside_watched(self) -> bool:
        """Some open container is a unique array or an object with a key rule."""
        return any(f.unique or f.rule is not None for f in self.stack)

    def may_repeat(self) -> bool:
        """An item or key in progress is, so far, the beginning of an earlier one as written."""
        return bool(self.rests())

    def rests(self) -> list[bytes]:
        """What is left to write of each earlier item the item in progress begins (all of
        each where an item is about to start), and of each earlier key of the object the
        key in progress begins."""
        out = []
        for i, f in enumerate(self.stack):
            starting = i == len(self.stack) - 1 and self.state == VALUE
            if f.unique and (f.in_item or starting):
                sofar = bytes(self.text[f.item_start :]) if f.in_item else b""
                out += [text[len(sofar) :] for text in f.texts if text.startswith(sofar)]
        if self.state == KEY and self.stack[-1].rule is not None:
            sofar = bytes(self.text[self.word_start :])
            out += [t[len(sofar) :] for t in self.stack[-1].key_texts if t.startswith(sofar)]
        return out

    def key_rests(self) -> list[bytes] | None:
        """In a key of an object whose possible keys are finitely many: what is left to write
        of each (closing quote included); None anywhere else."""
        if self.state != KEY or (pool := self.stack[-1].key_pool()) is None:
            return None
        sofar = bytes(self.text[self.word_start + 1 :])
        written = [_key_bytes(n) for n in pool]
        return [w[len(sofar) :] + b'"' for w in written if w.startswith(sofar)]

    @property
    def in_string(self) -> bool:
        return self.state in (STRING, KEY)

    def trial_copy(self) -> JsonScanner:
        return self._copy(bytearray(self.text), trial=True)

    def snapshot(self) -> JsonScanner:
        """A copy that shares nothing it changes, without the text: the text is only ever
        appended to, so the caller keeps its length, and a rollback gives the copy of a copy
        the text cut back to it (`text`) and reads on from there."""
        s = self._copy(bytearray(), trial=False)
        for f in s.stack:
            f.seen, f.texts = set(f.seen), list(f.texts)
        return s

    def _copy(self, text: bytearray, trial: bool) -> JsonScanner:
        s = JsonScanner.__new__(JsonScanner)
        s.arrays, s.keys, s.stack = self.arrays, self.keys, [f.copy() for f in self.stack]
        s.state, s.escape, s.word, s.word_start = (
            self.state,
            self.escape,
            self.word,
            self.word_start,
        )
        s.text, s.trial = text, trial
        return s

    def feed(self, data: bytes) -> bool:
        for byte in data:
            self.text.append(byte)
            if not self._step(byte):
                return False
        return True

    def _step(self, byte: int) -> bool:
        state = self.state
        if state in (STRING, KEY):
            if self.escape:
                self.escape = False
            elif byte == 0x5C:  # backslash
                self.escape = True
            elif byte == 0x22:  # closing quote
                if state == KEY:
                    self.state = COLON
                    return self._key(json.loads(self.text[self.word_start :].decode()))
                self.state = AFTER
                return self._completed()
            return state == STRING or self._key_viable()
        if state == NUMBER:
            if byte in _NUMBER:
                return True
            self.state = AFTER
            self.text.pop()
            done = self._completed()
            self.text.append(byte)
            return done and self._step(byte)
        if state == LITERAL:
            self.word += bytes([byte])
            if self.word in _LITERALS:
                self.state = AFTER
                return self._completed()
            return True
        if byte in _SPACE:
            return True
        if state == KEY_START:
            if byte == 0x22:
                self.state, self.word_start = KEY, len(self.text) - 1
            elif byte == 0x7D:  # } of an empty object
                return self._close()
            return self._key_viable()
        if state == COLON:
            self.state = VALUE if byte == 0x3A else COLON
            return True
        if state == AFTER:
            return self._after(byte)
        return self._value(byte)

    def _value(self, byte: int) -> bool:
        if self.stack and self.stack[-1].is_array:
            if byte == 0x5D:  # ] of an empty array
                return self._close()
            self.stack[-1].item_start, self.stack[-1].in_item = len(self.text) - 1, True
        elif self.stack and self.stack[-1].at in self.stack[-1].watch:
            self.stack[-1].item_start = len(self.text) - 1
        if byte in (0x7B, 0x5B):  # { or [
            is_array = byte == 0x5B
            path = [f.at for f in self.stack]
            unique = is_array and self.arrays.applies(path)
            if is_array or self.keys is None:
                self.stack.append(Frame(is_array, unique))
            else:
                keys = self.keys
                frame = Frame(False, False, keys.at(path))
                if keys.conditional:
                    frame.checks, frame.watch = keys.conditional_at(path), keys.watched_at(path)
                self.stack.append(frame)
            self.state = VALUE if is_array else KEY_START
        elif byte == 0x22:
            self.state = STRING
        elif byte in _NUMBER:
            self.state = NUMBER
        else:
            self.state, self.word = LITERAL, bytes([byte])
        return True

    def _after(self, byte: int) -> bool:
        if byte == 0x2C:  # ,
            top = self.stack[-1]
            if top.is_array:
                top.at += 1
                self.state = VALUE
                return True
            self.state = KEY_START
            return top.rule is None or top.key_pool() != frozenset()
        if byte in (0x5D, 0x7D):
            return self._close()
        return True

    def _close(self) -> bool:
        top = self.stack[-1]
        rule, keys = top.rule, top.keys
        if rule is not None and (
            len(keys) < rule.min_count or not _kept(rule.required, rule.formula, keys)
        ):
            return False
        closing = len(self.stack) - 1
        waiting = top.pending
        broken = [c for c, required, f in top.checks if not _kept(required, f, keys)]
        for conditions in (*waiting, *broken):
            if not self._wait(conditions, closing):
                return False
        self.stack.pop()
        self.state = AFTER
        return self._completed()

    def _unsettled(
        self, conditions: tuple[Condition, ...], closing: int = -1
    ) -> tuple[Condition, ...] | None:
        """The conditions not known yet; None where one is known to fail. On the object at
        depth `closing`, which is closing, a key that is not there fails a presence
        condition and holds a value condition (every instance there has that key, so its
        absence breaks the instance, whatever the rule)."""
        left = []
        for condition in conditions:
            depth, key, values = condition
            frame = self.stack[depth]
            if values is None:
                if key not in frame.keys:
                    if depth == closing:
                        return None
                    left.append(condition)
            elif key in frame.values:
                if frame.values[key] not in values:
                    return None
            elif depth != closing:
                left.append(condition)
        return tuple(left)

    def _wait(self, conditions: tuple[Condition, ...], closing: int = -1) -> bool:
        """A broken conditional rule: False where its conditions hold; else it waits on the
        deepest object whose key is not known yet (none where one of them fails)."""
        left = self._unsettled(conditions, closing)
        if left is None:
            return True
        if not left:
            return False
        frame = self.stack[max(depth for depth, _, _ in left)]
        frame.pending = (*frame.pending, left)
        return True

    def _settle(self, top: Frame) -> bool:
        """A key or a watched value of `top` just ended: the broken rules waiting on it are
        decided (False: one of them holds) or wait on."""
        waiting, top.pending = top.pending, ()
        return all(self._wait(conditions) for conditions in waiting)

    def _watched(self, top: Frame) -> bool:
        """A watched key's value just ended (see `_settle`)."""
        text = bytes(self.text[top.item_start :])
        top.values = {**top.values, top.at: canonical(json.loads(text.decode()))}
        return self._settle(top)

    def _key(self, key: str) -> bool:
        """A key just ended: under a key rule, new and leaving room for the missing ones."""
        top = self.stack[-1]
        top.at = key
        if top.rule is None:
            return True
        if key in top.keys or not top.has_room(key):
            return False
        top.keys = top.keys | {key}
        top.key_texts = (*top.key_texts, bytes(self.text[self.word_start :]))
        if top.pending and not self._settle(top):
            return False
        if top.rule.formula is None:
            return True
        pool = None if top.rule.names is None else top.rule.names - top.keys
        return satisfiable(top.rule.formula, top.keys, pool)

    def _key_viable(self) -> bool:
        """Some key that may still come begins with the key so far (where they are finitely
        many; a key written with escapes is left to its closing quote)."""
        if self.state != KEY or (pool := self.stack[-1].key_pool()) is None:
            return True
        sofar = bytes(self.text[self.word_start + 1 :])
        return b"\\" in sofar or any(_key_bytes(n).startswith(sofar) for n in pool)

    def _completed(self) -> bool:
        """A value just ended: as an item of a unique array, it must be new; as a watched
        key's value, it decides the rules waiting on it."""
        if not self.stack:
            return True
        top = self.stack[-1]
        if not top.is_array:
            return top.at not in top.watch or self._watched(top)
        top.in_item = False
        if not top.unique:
            return True
        text = bytes(self.text[top.item_start :])
        item = canonical(json.loads(text.decode()))
        if item in top.seen or item in top.tried:
            return False
        if self.trial:
            top.tried.add(item)
        else:
            top.seen.add(item)
            top.texts.append(text)
        return True


def _kept(required: frozenset[str], formula: Any, keys: frozenset[str]) -> bool:
    return required <= keys and (formula is None or holds(formula, keys))


def _key_bytes(name: str) -> bytes:
    return json.dumps(name, ensure_ascii=False)[1:-1].encode()
