"""What a target step costs, measured online: t = a + b * tokens.

Speculation is only worth its verification tokens if they are cheap. On a GPU at small batch a
step is bound by reading the weights, so b is close to 0 and drafts are nearly free; on a CPU
the matmuls are compute-bound from a few tokens on, so every verified token costs a fixed share
of a step. Rather than guessing per device, the model runner reports every step's wall time and
number of scheduled tokens, and this fits a line through them by least squares with exponential
forgetting (recent steps count most: the batch, the contexts and the machine's load drift).

The slope is only identifiable when the token counts vary (prefill chunks, verification steps,
batch changes); while they do not, the last well-posed fit is kept. Before any, b = 0 and a is
the mean step time: tokens look free, so speculation starts on and its own steps supply the spread.
"""

from __future__ import annotations

FORGET = 0.97  # weight of the past per observed step (half-life ~23 steps)
MIN_TOKEN_VARIANCE = 0.5  # tokens^2: below this spread the slope is noise; keep the last fit


class StepCostModel:
    def __init__(self, forget: float = FORGET) -> None:
        self.forget = forget
        # Exponentially weighted sums of 1, n, t, n^2, n*t.
        self._w = self._n = self._t = self._nn = self._nt = 0.0
        self.a = 0.0  # seconds per step whatever its tokens
        self.b = 0.0  # seconds per scheduled token

    @property
    def fitted(self) -> bool:
        return self._w > 0

    def observe(self, num_tokens: int, seconds: float) -> None:
        f = self.forget
        n, t = float(num_tokens), float(seconds)
        self._w = f * self._w + 1.0
        self._n = f * self._n + n
        self._t = f * self._t + t
        self._nn = f * self._nn + n * n
        self._nt = f * self._nt + n * t
        mean_n, mean_t = self._n / self._w, self._t / self._w
        variance = self._nn / self._w - mean_n * mean_n
        if variance >= MIN_TOKEN_VARIANCE:
            covariance = self._nt / self._w - mean_n * mean_t
            # A step never gets cheaper with more tokens: a negative slope is noise.
            self.b = max(0.0, covariance / variance)
        self.a = max(0.0, mean_t - self.b * mean_n)

    def step_seconds(self, num_tokens: int) -> float:
        return self.a + self.b * num_tokens
