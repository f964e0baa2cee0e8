"""The cost of a decode step, fitted to the engine's own steps, that the draft budget
(speculative.py) prices drafts by: T = base + per_row * rows + per_draft_step * [the step
verifies drafts], one least-squares fit with no term negative per span of rows between the
places where the cost jumps (a weight form's row limit, a kernel's stair). A leaf: numbers
in, seconds out.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

COST_WINDOW = 256  # steps the row-cost fit remembers
# Decode steps after which what a span (or one term of its fit) last measured is forgotten,
# so that it is tried, and measured, again: drafts priced at a busy moment (another job on
# the cores) would otherwise stay priced so for good, since only draft steps measure them
STALE_STEPS = 4 * COST_WINDOW


class SpanCost:
    """Seconds a decode step of a span of rows takes, fitted by least squares over the recent
    ones: T = base + per_row * rows + per_draft_step * [the step verifies drafts]. The last
    term is what leaving the attention backend's one-row decode path costs, whatever the rows.
    A term whose feature has not varied yet keeps its last value (zero at first: drafting is
    tried, and so measured), for STALE_STEPS steps after it last varied in the window, and
    is zero again after that. No term is negative: the fit is least squares under that bound,
    where clamping a negative term of the unbounded solve would leave the others fitted
    beside it (a span of 5-8 rows priced a plain step at 0.2 s, against 22 ms
    measured, so every draft looked as if it saved time)."""

    def __init__(self, window: int = COST_WINDOW) -> None:
        # The last `window` steps' (1, rows, drafted, seconds), oldest overwritten first, and
        # the sums of their outer products: the fit runs every step, from those sums (the
        # normal equations) in plain Python, a few microseconds on the engine's thread,
        # where a numpy solve would call into BLAS beside torch's threads. The sums are
        # summed afresh once per window, so no rounding accumulates.
        self._ring: list[tuple[float, ...]] = [(0.0,) * 4] * window  # zeros: add nothing
        self._moments = [[0.0] * 4 for _ in range(4)]
        self.num_samples = 0  # steps recorded, all told
        self.base, self.per_row, self.per_draft_step = 0.0, 0.0, 0.0
        self.last_tick = 0  # the step (StepCost's count) this span last recorded
        self._varied_at = [0, 0]  # the step at which rows, and drafted, last varied

    def record(self, rows: int, drafted: bool, seconds: float, tick: int | None = None) -> None:
        """One step's seconds; `tick`: the step's number among all spans' (StepCost's count;
        this span's own count where None)."""
        tick = self.num_samples + 1 if tick is None else tick
        self.last_tick = tick
        window, m = len(self._ring), self._moments
        slot = self.num_samples % window
        z, old = (1.0, float(rows), float(drafted), float(seconds)), self._ring[slot]
        for a in range(4):
            for b in range(4):
                m[a][b] += z[a] * z[b] - old[a] * old[b]
        self._ring[slot] = z
        self.num_samples += 1
        if slot == window - 1:
            m = self._moments = [
                [sum(r[a] * r[b] for r in self._ring) for b in range(4)] for a in range(4)
            ]
        n = m[0][0]  # a feature varied where its variance is above zero (exact: integers)
        varied = [0, *(j for j in (1, 2) if n * m[j][j] - m[0][j] ** 2 > 0)]
        for j in varied[1:]:
            self._varied_at[j - 1] = tick
        kept = (  # where a feature has not varied: its last value, while fresh
            0.0,
            *(
                value if tick - at <= STALE_STEPS else 0.0
                for value, at in zip((self.per_row, self.per_draft_step), self._varied_at)
            ),
        )
        self.base, self.per_row, self.per_draft_step = _fit_non_negative(m, varied, kept)


def _fit_non_negative(
    m: list[list[float]], varied: list[int], kept: tuple[float, ...]
) -> tuple[float, ...]:
    """(base, per_row, per_draft_step): least squares from the moments `m` of (1, rows,
    drafted, seconds) with no term negative, exactly: the unbounded solve over the `varied`
    terms where none comes out negative, else the best of the solves with each smaller
    subset of them free and the rest held at zero (at most 7 more, each at most 3x3). A term
    not varied keeps its value in `kept`."""
    best, least = kept, math.inf
    for size in range(len(varied), -1, -1):
        for free in itertools.combinations(varied, size):
            beta = [0.0 if j in varied else kept[j] for j in range(3)]
            fixed = [f for f in range(3) if f not in free]
            lhs = [[m[a][b] for b in free] for a in free]
            rhs = [m[a][3] - sum(beta[f] * m[a][f] for f in fixed) for a in free]
            coef = _solve(lhs, rhs) if free else []
            if any(c < 0 for c in coef):
                continue
            for j, c in zip(free, coef):
                beta[j] = float(c)
            if size == len(varied):  # the unbounded optimum is within the bounds
                return tuple(beta)
            sse = m[3][3] - 2 * sum(beta[a] * m[a][3] for a in range(3))
            sse += sum(beta[a] * beta[b] * m[a][b] for a in range(3) for b in range(3))
            if sse < least:
                best, least = tuple(beta), sse
    return best


def _solve(lhs: list[list[float]], rhs: list[float]) -> list[float]:
    """x with lhs x = rhs (at most 3 unknowns), by elimination with partial pivoting; where
    lhs is singular (two features that moved together), the least-norm solution, as a
    least-squares solve gives it."""
    k = len(rhs)
    a = [row[:] + [r] for row, r in zip(lhs, rhs)]
    scale = max(abs(v) for row in lhs for v in row) or 1.0
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-12 * scale:
            return [float(c) for c in np.linalg.lstsq(np.array(lhs), np.array(rhs))[0]]
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, k):
            f = a[r][col] / a[col][col]
            for c in range(col, k + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * k
    for r in range(k - 1, -1, -1):
        x[r] = (a[r][k] - sum(a[r][c] * x[c] for c in range(r + 1, k))) / a[r][r]
    return x


class StepCost:
    """Seconds a decode step takes: one `SpanCost` per span of rows between `limits`, the row
    counts past which some linear multiplies by another kernel (layers.form_row_limits) or
    the compiled step leaves the step to eager (its max_rows), as the cost jumps there. A
    span no step has reached yet is priced as the nearest one below it that a step has (so
    crossing a limit is tried, and so measured), and so is a span no step has reached in
    STALE_STEPS steps, whose samples are forgotten as the next one comes."""

    def __init__(self, limits: tuple[int, ...] | list[int] = (), window: int = COST_WINDOW):
        self.limits = np.array(sorted(set(limits)), dtype=np.int64)
        self.window = window
        self.spans = [SpanCost(window) for _ in range(len(self.limits) + 1)]
        self.coef: np.ndarray | None = None  # [base, per_row, per_draft_step] x span
        self.tick = 0  # steps recorded, all spans together

    def span(self, rows: int) -> SpanCost:
        return self.spans[self._index(rows)]

    def _index(self, rows: int) -> int:
        return int(np.searchsorted(self.limits, rows))

    def fresh(self, span: SpanCost) -> bool:
        """Whether the span has a measurement, from the last STALE_STEPS steps."""
        return span.num_samples > 0 and self.tick - span.last_tick <= STALE_STEPS

    def record(self, rows: int, drafted: bool, seconds: float) -> None:
        self.tick += 1
        i = self._index(rows)
        if self.spans[i].num_samples and not self.fresh(self.spans[i]):
            self.spans[i] = SpanCost(self.window)  # stale: measured afresh
        self.spans[i].record(rows, drafted, seconds, self.tick)
        self.coef = None

    def seconds(self, rows, drafted: bool = False):
        """T(rows) for an int or an array of row counts."""
        if self.coef is None:
            coef, measured = [], (0.0, 0.0, 0.0)
            for span in self.spans:
                if self.fresh(span):
                    measured = (span.base, span.per_row, span.per_draft_step)
                coef.append(measured)
            self.coef = np.array(coef).T
        base, per_row, per_draft_step = self.coef
        i = np.searchsorted(self.limits, rows)
        return base[i] + per_row[i] * rows + per_draft_step[i] * drafted
