"""The draft budget of speculative decoding without a draft model (SGLang's NGRAM
algorithm): how many tokens each request drafts, and which of a step's drafts are verified.
The drafts come from the sources in speculative_sources.py (the radix tree, prompt lookup),
after the constraint's forced text; they are verified like every draft (draft.py), so a
wrong one costs only time: its rows in the forward, and a step off the attention backend's
decode path.

`DraftBudget` decides from measurements: the cost of a step (`StepCost`, fitted to the
engine's own decode steps) and each request's acceptance so far (a geometric model: a draft
token stands with probability `a` once those before it stood, so the j-th is worth a^j
tokens; `a` starts from what recent requests' drafts did, `DraftBudget.prior`). How many
tokens a request drafts (`length`): the k that maximizes what its drafts
are expected to save, a + ... + a^k sampled tokens at T(B)/B seconds each for a plain step of
B rows taking T(B), less what k more rows cost. (The k that makes the most tokens a second
is the right measure for a model that knew each draft's chances; under the geometric one,
which cannot see that a copied passage's drafts stand or fall whole, it chose drafts too
short: 0.96x this measure's tokens a second on rewrites, in one process.) Which of a step's
drafts go (`settle`): the same choice over all of them together, likeliest tokens first,
also paying for leaving the attention backend's decode path, which a step with any draft
pays whatever its rows. The cost is fitted per span of rows between the places where it
jumps: the weights' row limits (a linear that multiplies few rows by the GGUF's own int4
blocks and more by packed bfloat16 costs several times more one row past its limit) and the
stairs of a kernel's row blocks (torch's int4 kernel multiplies 4 rows a pass over the
weight, so 5 rows cost about what 8 do), so drafts that would cross a limit are cut to stay
under it where that saves more, and a draft that crosses into a stair runs to its end. So
one request on a CPU, where weights dominate, drafts whenever anything matches, up to the
rows its fast kernel takes; a large batch drafts only what is likely to stand, and only
where it pays for leaving the decode path.

With no request waiting, a batch steps in lockstep: as often as the request with the most
tokens left needs. A token one request gains then frees only its row in later steps
(`token_value`), but drafts that every request due to end last has, likely to stand, end the
batch whole steps sooner (`lockstep_plan`: eight requests rewriting the same kind of text);
`settle` keeps whichever of the two plans saves more; once one of the requests the batch's
end waits for has found no draft, no step can be saved, and the step's other requests are
priced alone (`missed`: at a large batch they then look nothing up). The chance of saving j
steps is what lockstep steps saved lately (`steps_chance`, one half before any): a batch's
requests copy or do not together, where the product of eight requests' own chances would
never try. Its counts fade a step (`LOCKSTEP_DECAY`), so a batch whose drafts stood goes on
drafting, one whose drafts were refused stops, and tries again some hundreds of steps later.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .req import Req
from .step_cost import StepCost

if TYPE_CHECKING:
    from .batch import ScheduledBatch

# What lockstep drafts saved lately (DraftBudget.together_saved), each count decayed a step,
# half-life 256 steps: a batch whose drafts saved nothing tries again after about that many
LOCKSTEP_DECAY = 0.5 ** (1 / 256)
PRIOR_DECAY = 0.99  # a verified draft token's weight in the prior, a token later (~100 kept)
EVIDENCE_HALF_LIFE = 32  # sampled tokens without a draft over which a request's counts halve


@dataclass(slots=True)
class DraftBudget:
    """How many draft tokens a request gets, and which of a step's drafts go (see the
    module)."""

    max_tokens: int  # --speculative-num-draft-tokens minus the token the step samples anyway
    cost: StepCost = field(default_factory=StepCost)
    batch_size: int = 1  # requests in the last decode step (the batch a draft will join)
    # this step's lengths by request (id()) and its acceptance's counts: each draft source
    # asks; cleared as a step ends (the cost fit and the batch change then)
    lengths: dict[tuple[int, int, int], int] = field(default_factory=dict)
    # Every request's speculative draft tokens verified lately, stood and cut (each count
    # decayed by PRIOR_DECAY a token): where a request's acceptance starts, so a workload
    # that drafts well (a rewrite) goes on drafting in its next request, and one that drafts
    # badly stops sooner, rather than each request starting from one half
    stood: float = 0.0
    cut: float = 0.0
    # How many requests wait to be admitted (the scheduler's; None: assume some do)
    waiting: Callable[[], int] | None = None
    # whether no draft can pay this step, however likely; whether the batch steps in
    # lockstep and every request drafting could save it whole steps (then each request
    # looks up all it may, and settle prices the steps); and token_value: all worked out
    # once a step (by the step's first request to ask)
    hopeless: bool | None = None
    together: bool = False
    value: float = 0.0
    # this step: the most tokens a request looking drafts up has left to sample (the
    # requests whose drafts a lockstep plan needs; begin_drafts, missed)
    top_left: int = 0
    # Lockstep steps lately (decayed by LOCKSTEP_DECAY a step): by j, how many aimed to end
    # the batch at least j steps sooner and how many did; and the plan verified next, as
    # (request, tokens it had left, its tokens confirmed so far) and the steps it aimed at
    together_tried: list[float] = field(init=False)
    together_saved: list[float] = field(init=False)
    pending: tuple[list[tuple[Req, int, int]], int] | None = None

    def __post_init__(self) -> None:
        self.together_tried = [0.0] * self.max_tokens
        self.together_saved = [0.0] * self.max_tokens

    def learn(self, stood: bool) -> None:
        """One speculative draft token verified: whether it stood."""
        self.stood = self.stood * PRIOR_DECAY + stood
        self.cut = self.cut * PRIOR_DECAY + (not stood)

    @property
    def prior(self) -> float:
        """The acceptance a request starts from: stood / (stood + cut) lately, from one of
        each."""
        return (self.stood + 1) / (self.stood + self.cut + 2)

    def observe(self, batch: ScheduledBatch, seconds: float, measured: bool = True) -> None:
        """One step's wall time; decode steps (drafts verified or not) enter the fit, but a
        step whose time is no measure of the next ones' (`measured` False: it compiled)."""
        self.lengths.clear()
        self.hopeless = None
        self.together_tried = [n * LOCKSTEP_DECAY for n in self.together_tried]
        self.together_saved = [n * LOCKSTEP_DECAY for n in self.together_saved]
        if batch.reqs and not any(batch.is_prefill) and measured:
            self.batch_size = len(batch.reqs)
            self.cost.record(sum(batch.num_new), any(n > 1 for n in batch.num_new), seconds)

    @property
    def per_token(self) -> float:
        """What one sampled token costs now: a plain step's time over its requests."""
        return float(self.cost.seconds(self.batch_size)) / self.batch_size

    @property
    def token_value(self) -> float:
        """The seconds a draft token that stands saves: one request's share of a plain step
        where the row it frees goes to a waiting request or the step itself goes (one
        request), but only its row's cost in a later step, T(B) - T(B - 1), where the batch
        runs on without it: with no request waiting, the batch's steps are as many as its
        slowest request needs, so tokens one request gains shrink later steps by a row each
        and remove none (a fixed batch of 32 random prompts, NGRAM beside the compiled step:
        0.85x, drafting at half its steps for tokens valued at the share)."""
        b = self.batch_size
        share = self.per_token
        if not self.in_lockstep(b):
            return share
        row = float(self.cost.seconds(b)) - float(self.cost.seconds(b - 1))
        return min(max(row, 0.0), share)

    def in_lockstep(self, rows: int) -> bool:
        """Whether a batch of `rows` requests steps as often as its slowest request needs:
        more than one request, and none waiting for a row one of them frees."""
        return rows > 1 and self.waiting is not None and self.waiting() == 0

    def best(self, chances: np.ndarray, rows: int, drafted: bool, per_token: float) -> int:
        """How many of the draft tokens to verify, likeliest first (chances: each one's
        probability of standing, descending) in a step of `rows` rows without them (`drafted`:
        whether that step already verifies drafts, so left the decode path): the count whose
        expected saving (per_token seconds a token), less the rows' and leaving the decode
        path's cost, is largest (the most such, so where nothing is measured all are tried)."""
        return self._best(chances, rows, drafted, per_token)[0]

    def _best(
        self, chances: np.ndarray, rows: int, drafted: bool, per_token: float
    ) -> tuple[int, float]:
        """best's count and the seconds it is expected to save, net."""
        saved = np.concatenate([[0.0], np.cumsum(chances)]) * per_token
        extra = np.arange(len(chances) + 1)
        cost = self.cost.seconds(rows + extra, True) - self.cost.seconds(rows, drafted)
        cost[0] = 0.0
        value = saved - cost
        count = len(value) - 1 - int(np.argmax(value[::-1]))
        return count, float(value[count])

    def steps_pay(self, rows: int, n: int) -> bool:
        """Whether a batch of `rows` requests in lockstep, each drafting j <= n tokens sure to
        stand, saves more (j whole plain steps) than the draft step's rows cost."""
        step = float(self.cost.seconds(rows))
        j = np.arange(1, n + 1)
        extra = self.cost.seconds(rows + rows * j, True) - step
        return bool(np.any(j * step > extra))

    def lockstep_plan(
        self, live: list[Req], left: list[int], rows: int, drafted: bool
    ) -> tuple[int, float] | None:
        """Drafts that shorten a batch in lockstep by whole steps (`left`: each live
        request's tokens left to sample): the steps j to save, and the seconds that saves,
        net; None where nothing pays.

        The batch ends when the request with the most tokens left to sample (R*) ends, so it
        ends j steps sooner when every request i with R_i > R* - j gains R_i - R* + j tokens,
        the others needing none. A batch where one such request has no draft saves no step;
        its drafts are worth rows (token_value). The chance of saving j steps is what
        lockstep steps saved lately (`steps_chance`), not the product of each request's
        chances: a batch's requests copy, or do not, together (eight rewrites), where eight
        independent chances of a half would never try."""
        top = max(left)
        size = [len(r.draft) if r.draft and r.speculative_draft else 0 for r in live]
        step = float(self.cost.seconds(len(live)))
        before = float(self.cost.seconds(rows, drafted))
        chances = self.steps_chance()
        saved, best_j, best_value = 0.0, 0, 0.0
        for j in range(1, self.max_tokens + 1):
            need = [max(0, n - top + j) for n in left]
            if any(k > s for k, s in zip(need, size)):
                break
            saved += chances[j - 1]
            extra = float(self.cost.seconds(rows + sum(need), True)) - before
            if saved * step - extra > best_value:
                best_j, best_value = j, saved * step - extra
        return (best_j, best_value) if best_j else None

    def steps_chance(self) -> list[float]:
        """By j (from 1): the chance a lockstep step ends the batch at least j steps sooner,
        (saved + 1) / (tried + 2) over the lockstep steps lately that aimed at j or more (one
        half before any), never above that of j - 1."""
        pairs = zip(self.together_saved, self.together_tried)
        chances = [(s + 1) / (t + 2) for s, t in pairs]
        return list(itertools.accumulate(chances, min))

    def score_lockstep(self) -> None:
        """Count what the lockstep plan verified last did: for each j it aimed at, whether
        every request that needed tokens for j steps got them."""
        if self.pending is None:
            return
        plan, aim = self.pending
        self.pending = None
        top = max(n for _, n, _ in plan)
        got = [(r.num_forced_tokens - base, n) for r, n, base in plan]
        for j in range(1, aim + 1):
            self.together_tried[j - 1] += 1
            self.together_saved[j - 1] += all(g >= k - top + j for g, k in got)

    def length(self, req: Req) -> int:
        """The request's draft length, as if it alone drafted in a step that already verifies
        drafts (whether the step's drafts pay for that is `settle`'s)."""
        if self.max_tokens <= 0:
            return 0
        # and so its acceptance (whose fading moves only between steps, which clear lengths)
        key = (id(req), req.num_forced_tokens, req.num_drafts_cut)
        if (known := self.lengths.get(key)) is not None:
            return known
        if self.per_token <= 0:
            return self.max_tokens  # nothing measured yet: tried
        if self.hopeless is None:
            self._price_step()
        if self.hopeless:  # settle would drop them all: none is looked up
            return 0
        if self.together:  # what the others draft decides what this one's are worth: settle
            self.lengths[key] = self.max_tokens
            return self.max_tokens
        chances = acceptance(req, self.prior) ** np.arange(1, self.max_tokens + 1)
        self.lengths[key] = found = self.best(chances, self.batch_size, True, self.value)
        return found

    def _price_step(self) -> None:
        """Whether this step's drafts could pay at all, each token sure to stand: in
        lockstep (`together`), or each request's alone (else `hopeless` where none could).
        (Priced as a step without a constraint's forced text, which would leave the decode
        path anyway: such a step may verify fewer speculative drafts than would pay.)"""
        b, n, self.value = self.batch_size, self.max_tokens, self.token_value
        self.together = self.in_lockstep(b) and self.steps_pay(b, n)
        self.hopeless = not self.together and self._alone_hopeless()

    def _alone_hopeless(self) -> bool:
        b = self.batch_size
        return self.best(np.ones(b * self.max_tokens), b, False, self.value) == 0

    def begin_drafts(self, reqs: list[Req]) -> None:
        """Before a step's requests look drafts up: the most tokens one of them has left."""
        left = (r.tokens_left for r in reqs if r.finish is None and not r.is_prefilling)
        self.top_left = max(left, default=0)

    def missed(self, req: Req) -> None:
        """`req` has no speculative draft this step. Where it is one of the requests the
        batch's end waits for (the most tokens left), no lockstep plan can save a step
        (lockstep_plan needs a draft from each of them), so the requests after it are priced
        alone, by their rows: at a large batch that is hopeless, and they look nothing up (a
        batch of 32 random prompts, eager: 1.2% of the run in lookups and pricing that
        settle then dropped)."""
        if self.max_tokens <= 0 or self.per_token <= 0:
            return
        if self.hopeless is None:
            self._price_step()
        if self.together and req.tokens_left >= self.top_left:
            self.together = False
            self.hopeless = self._alone_hopeless()

    def settle(self, reqs: list[Req]) -> None:
        """Keep of the step's speculative drafts the likeliest tokens that, together, save
        the most beyond what their rows and the draft step cost, and drop the rest (a draft
        is cut from its end). Constraint drafts stay: they are verified whatever the budget."""
        self.score_lockstep()  # the last plan's drafts were verified in this step
        drafts = [r for r in reqs if r.draft and r.speculative_draft]
        if not drafts:
            return
        live = [r for r in reqs if r.finish is None]
        forced = sum(len(r.draft) for r in live if r.draft and not r.speculative_draft)
        each = [(acceptance(r, self.prior), len(r.draft)) for r in drafts]
        tokens = sorted(
            ((a**j, i) for i, (a, n) in enumerate(each) for j in range(1, n + 1)), reverse=True
        )
        chances = np.array([p for p, _ in tokens])
        rows, drafted = len(live) + forced, forced > 0
        keep, value = self._best(chances, rows, drafted, self.token_value)
        if self.in_lockstep(len(live)):
            left = [r.tokens_left for r in live]
            plan = self.lockstep_plan(live, left, rows, drafted)
            if plan is not None and plan[1] > value:  # whole steps saved: each keeps its part
                j, top = plan[0], max(left)
                needs = {id(r): max(0, n - top + j) for r, n in zip(live, left)}
                for r in drafts:
                    _cut(r, needs.get(id(r), 0))
                self.pending = [(r, n, r.num_forced_tokens) for r, n in zip(live, left)], j
                return
        kept = Counter(i for _, i in tokens[:keep])
        for i, r in enumerate(drafts):
            _cut(r, kept[i])


def _cut(req: Req, keep: int) -> None:
    """Keep the first `keep` tokens of the request's speculative draft."""
    keep = min(keep, len(req.draft))
    req.num_draft_tokens -= len(req.draft) - keep
    req.draft = req.draft[:keep]
    req.speculative_draft = bool(req.draft)


def acceptance(req: Req, prior: float = 0.5) -> float:
    """The chance a draft token stands once those before it did: stood / (stood + cut),
    from two tokens' worth of `prior` before any of the request's own is seen. The
    request's own counts fade by half every EVIDENCE_HALF_LIFE tokens it samples without a
    draft verified, back to the prior: a request whose drafts were refused early (before the
    text it copies began) drafts again later, after a wait that grows with its refusals,
    where fixed counts would have stopped it for good."""
    idle = len(req.output_ids) - req.drafted_at
    weight = 0.5 ** (idle / EVIDENCE_HALF_LIFE) if idle > 0 else 1.0
    stood, cut = weight * req.num_forced_tokens, weight * req.num_drafts_cut
    return (stood + 2 * prior) / (stood + cut + 2)
