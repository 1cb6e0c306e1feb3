"""What speculation costs, measured online: a plane fit t = a + b * x + c * y with forgetting.

Two prices come out of it (engine/spec_decode/controller.py uses both):

- StepCostModel, a target step: t = a + b * tokens + c * attention. Speculation is only worth
  its verification tokens if they are cheap. On a GPU at small batch a step is bound by reading
  the weights, so b and c are close to 0 and drafts are nearly free; on a CPU the matmuls are
  compute-bound from a few tokens on, so every verified token costs a share of a step (b), and, at
  long contexts, attention over the whole context once more (c times the keys it reads): agent
  turns with 2k-token histories made attention 40% of a server's time here, and a draft verified
  there costs several times one verified at 200 tokens. The model runner reports every step's wall
  time, its number of scheduled tokens and its attention work (the keys all its query tokens read;
  attention_work).
- DraftCostModel, a draft model's proposing: t = fixed + per_depth * depth + per_token * tokens.
  A draft model drafts position by position: drafting k tokens for a batch is k sequential passes
  (depth k, set by the request that drafts most), each a small forward whose price barely moves
  with the number of requests in it. Measured here for the shipped EAGLE head (bf16, 2 cores):
  ~2 ms a step to start, ~2.2 ms per position, ~0.1 ms per drafted token: at batch 8, 4 positions
  cost 15 ms of a 45 ms step whether 8 or 32 tokens come out, which a price per drafted token
  (the earlier model: seconds / tokens) put at 0.5 ms a token and so let through.

A line prices every verified token alike, and a CPU's step is not a line in its token count: the
few-row linear kernel (kernels/cpu/skinny_linear.cpp) streams the weights once for up to 8 rows,
so on an AVX2 EPYC a step of 8 tokens took 36 ms, one of 5 took 32, but one of 16 took 58 (a
second pass over every weight row) and one of 17 took 78 (oneDNN). Since its rows past 8 run in
2 x 4 register tiles (up to 40 rows) the stairs are lower, not gone: 9 tokens 43 ms, 16 54, 17
60 (and since its first pass takes up to 10 rows, 9 tokens cost about what 8 do). So the step
model also keeps the seconds of the steps it saw by token count (less the attention term,
exponentially averaged), and `surcharge(n, k)` says how much more than the fitted slope a token
costs on average when k tokens are added to a step of n (the secant over that table, where both
ends were seen or lie between seen counts): the controller plans with the slope, then prices the
plan's own tokens by the secant when that is steeper and plans again; a batch size whose plain
step it has not seen drafts once as priced, then runs one plain step (the line's intercept,
pulled up by prompt chunks, says nothing about it, and a batch that drafts on every step would
never see one). Only ever dearer: where the table says less, the line stands (pricing the
1-8-token stretch as free would draft deep on every step).

The table only knows the steps run, and a batch whose drafts the line priced out never runs the
steps that would show them cheap. So the runner sweeps the step once by row count
(engine/worker/step_sweep.py) and hands it over (sweep): a count no step was seen at reads as its
sweep plus the gap between the steps seen and their sweep (interpolated between the nearest seen
counts), the sweep giving the stairs, the steps seen the level; the controller then plans
batches on the table itself (controller.py's _plan_batch) rather than on the line and its
surcharge.

The fit is least squares with exponential forgetting (recent observations count most: the batch,
the contexts and the machine's load drift). The slopes are only identifiable when the regressors
vary; while x does not, the last well-posed fit is kept; while x and y move together, y is left
out (c = 0, b takes both). Before any fit, b = c = 0 and a is the mean: work looks free (the
controller then drafts one token per request, no more, so its own steps supply the spread when
the prefill and plain decode steps do not). A slope is never negative (more work
never costs less).
"""

from __future__ import annotations

import bisect

FORGET = 0.97  # weight of the past per observation (half-life ~23)
TABLE_DECAY = 0.8  # weight of a token count's past steps per new one in the step table
MIN_X_VARIANCE = 0.5  # x^2: below this spread the slope is noise; keep the last fit
MIN_INDEPENDENCE = 0.02  # 1 - correlation^2 of x and y below which c is not identifiable


def attention_work(query_lens: list[int], seq_lens: list[int]) -> float:
    """Keys read by a step's query tokens: request r's q queries end at position seq_len - 1 and
    query i sees seq_len - q + i + 1 keys (causal), q * seq_len - q * (q - 1) / 2 in all."""
    return float(sum(q * s - q * (q - 1) // 2 for q, s in zip(query_lens, seq_lens)))


class PlaneFit:
    """t = a + b * x + c * y, fitted online (see the module docstring)."""

    def __init__(self, forget: float = FORGET) -> None:
        self.forget = forget
        # Exponentially weighted sums of 1, x, y, t and their products.
        self._w1 = self._x = self._y = self._t = 0.0
        self._xx = self._yy = self._xy = self._xt = self._yt = 0.0
        self.a = 0.0
        self.b = 0.0
        self.c = 0.0
        self.identified = False  # whether x has varied enough, once, to fit a slope

    @property
    def fitted(self) -> bool:
        return self._w1 > 0

    def observe(self, x: float, y: float, t: float) -> None:
        f = self.forget
        x, y, t = float(x), float(y), float(t)
        self._w1 = f * self._w1 + 1.0
        self._x = f * self._x + x
        self._y = f * self._y + y
        self._t = f * self._t + t
        self._xx = f * self._xx + x * x
        self._yy = f * self._yy + y * y
        self._xy = f * self._xy + x * y
        self._xt = f * self._xt + x * t
        self._yt = f * self._yt + y * t
        k = self._w1
        mean_x, mean_y, mean_t = self._x / k, self._y / k, self._t / k
        var_x = self._xx / k - mean_x * mean_x
        if var_x >= MIN_X_VARIANCE:
            self.identified = True
            var_y = self._yy / k - mean_y * mean_y
            cov_xy = self._xy / k - mean_x * mean_y
            cov_xt = self._xt / k - mean_x * mean_t
            cov_yt = self._yt / k - mean_y * mean_t
            b, c = max(0.0, cov_xt / var_x), 0.0  # x alone
            det = var_x * var_y - cov_xy * cov_xy
            if var_y > 0 and det > MIN_INDEPENDENCE * var_x * var_y:
                b2 = (cov_xt * var_y - cov_yt * cov_xy) / det
                c2 = (cov_yt * var_x - cov_xt * cov_xy) / det
                if b2 >= 0 and c2 >= 0:
                    b, c = b2, c2
                elif c2 > 0:  # x explains nothing beyond y
                    b, c = 0.0, max(0.0, cov_yt / var_y)
            self.b, self.c = b, c
        self.a = max(0.0, mean_t - self.b * mean_x - self.c * mean_y)

    def predict(self, x: float, y: float = 0.0) -> float:
        return self.a + self.b * x + self.c * y


class StepCostModel(PlaneFit):
    """A target step: a seconds whatever its work, b per scheduled token, c per key read; and the
    steps seen by token count, for what the line misses (surcharge)."""

    def __init__(self, forget: float = FORGET) -> None:
        super().__init__(forget)
        self._seen: dict[int, float] = {}  # token count -> averaged seconds less c * attention
        self._swept: dict[int, float] = {}  # token count -> the runner's sweep (sweep())
        self._known: dict[int, float] | None = None  # _table(), until the next step or sweep

    @property
    def swept(self) -> bool:
        return bool(self._swept)

    def sweep(self, seconds_by_rows: dict[int, float]) -> None:
        """The runner's sweep of the step by row count (engine/worker/step_sweep.py): its forward
        and logits alone. A count no step was seen at reads as its sweep plus what the steps seen
        cost beyond theirs (building inputs, sampling, contexts longer than the sweep's): the
        sweep gives the staircase's shape, the steps seen its level (_table)."""
        self._swept = {int(n): float(t) for n, t in seconds_by_rows.items() if n >= 1}
        self._known = None

    def observe(self, num_tokens: int, seconds: float, attention: float = 0.0) -> None:  # type: ignore[override]
        super().observe(num_tokens, attention, seconds)
        residual = float(seconds) - self.c * float(attention)
        before = self._seen.get(int(num_tokens))
        self._seen[int(num_tokens)] = residual if before is None else (
            TABLE_DECAY * before + (1 - TABLE_DECAY) * residual)
        self._known = None

    def _table(self) -> dict[int, float]:
        """Seconds by token count: the steps seen, and the swept counts not seen, each its sweep
        plus the gap between the steps seen and their sweep, interpolated between the nearest
        seen counts that were swept (the nearest one's beyond them; none before any is seen)."""
        if self._known is not None:
            return self._known
        known = dict(self._seen)
        both = sorted(n for n in self._seen if n in self._swept)
        gaps = [self._seen[n] - self._swept[n] for n in both]
        for n, swept in self._swept.items():
            if n in known:
                continue
            if not both:
                gap = 0.0
            elif n <= both[0]:
                gap = gaps[0]
            elif n >= both[-1]:
                gap = gaps[-1]
            else:
                above = bisect.bisect_left(both, n)
                lo, hi = both[above - 1], both[above]
                gap = gaps[above - 1] + (gaps[above] - gaps[above - 1]) * (n - lo) / (hi - lo)
            known[n] = swept + gap
        self._known = dict(sorted(known.items()))
        return self._known

    def table_seconds(self, num_tokens: int) -> float | None:
        """A step of num_tokens tokens as the table has it (less attention): its own average, else
        the straight line between the nearest counts seen below and above; None outside them."""
        return _read(self._table(), num_tokens)

    def surcharge(self, num_tokens: int, added: int) -> float:
        """Seconds per token beyond the slope b that `added` more tokens cost on a step of
        num_tokens, by the table's secant; 0 when the table does not span both or says less."""
        if added <= 0:
            return 0.0
        base, more = self.table_seconds(num_tokens), self.table_seconds(num_tokens + added)
        if base is None or more is None:
            return 0.0
        return max(0.0, (more - base) / added - self.b)

    def secant_seconds(self, num_tokens: int, added: int) -> float | None:
        """Seconds per token that `added` more tokens cost on a step of num_tokens, by the
        table's secant (attention excluded, never negative); None unless both steps were seen."""
        if added <= 0 or not (self.seen(num_tokens) and self.seen(num_tokens + added)):
            return None
        return max(0.0, (self._seen[num_tokens + added] - self._seen[num_tokens]) / added)

    def envelope(self, max_tokens: int) -> list[float]:
        """Seconds of a step of 1..max_tokens tokens (index n - 1; attention excluded) by the
        table, made non-decreasing (more tokens never cost less): between seen counts the line
        between them, below the least seen count its step, past the most the slope (swept counts
        count as seen: _table). Empty before any step was seen or swept."""
        table = self._table()
        if not table:
            return []
        counts = list(table)
        least, most = counts[0], counts[-1]
        steps: list[float] = []
        for n in range(1, max_tokens + 1):
            seconds = table.get(n)
            if seconds is None and least < n < most:
                seconds = _read(table, n)
            if seconds is None:
                seconds = table[least] if n < least else table[most] + self.b * (n - most)
            steps.append(max(seconds, steps[-1]) if steps else seconds)
        return steps

    def seen(self, num_tokens: int) -> bool:
        """Whether a step of exactly num_tokens tokens was observed (the base of a secant)."""
        return num_tokens in self._seen

    def step_seconds(self, num_tokens: int, attention: float = 0.0) -> float:
        return self.predict(num_tokens, attention)

    def token_seconds(self, context_len: int) -> float:
        """What one more verified token at a context of context_len tokens adds to a step."""
        return self.b + self.c * (context_len + 1)


class DraftCostModel(PlaneFit):
    """A draft model's propose call: a (fixed) + b per position drafted in sequence (depth) + c per
    drafted token."""

    def observe(self, depth: int, num_tokens: int, seconds: float) -> None:  # type: ignore[override]
        super().observe(depth, num_tokens, seconds)
        if not self.identified and self._x > 0:
            # Until the depth has varied, all of it is priced per position: shallower drafts then
            # look cheaper, so the controller tries them and the spread to fit comes.
            self.a, self.b, self.c = 0.0, self._t / self._x, 0.0

    @property
    def fixed(self) -> float:
        return self.a

    @property
    def per_depth(self) -> float:
        return self.b

    @property
    def per_token(self) -> float:
        return self.c

    def seconds(self, depth: int, num_tokens: int) -> float:
        return 0.0 if depth <= 0 else self.predict(depth, num_tokens)


def _read(table: dict[int, float], num_tokens: int) -> float | None:
    """StepCostModel.table_seconds over a table already built (its keys in increasing order)."""
    found = table.get(num_tokens)
    if found is not None:
        return found
    counts = list(table)
    above = bisect.bisect_left(counts, num_tokens)
    if above == 0 or above == len(counts):
        return None
    below, above = counts[above - 1], counts[above]
    t_below, t_above = table[below], table[above]
    return t_below + (t_above - t_below) * (num_tokens - below) / (above - below)
