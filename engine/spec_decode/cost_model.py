"""What a target step costs, measured online: t = a + b * tokens + c * attention.

Speculation is only worth its verification tokens if they are cheap. On a GPU at small batch a
step is bound by reading the weights, so b and c are close to 0 and drafts are nearly free; on a
CPU the matmuls are compute-bound from a few tokens on, so every verified token costs a fixed share
of a step (b), and, at long contexts, attention over the whole context once more (c times the
keys it reads): agent turns with 2k-token histories made attention 40% of a server's time here,
and a draft verified there costs several times one verified at 200 tokens. Rather than guessing
per device, the model runner reports every step's wall time, its number of scheduled tokens and
its attention work (the keys all its query tokens read; attention_work), and this fits a plane
through them by least squares with exponential forgetting (recent steps count most: the batch,
the contexts and the machine's load drift).

The slopes are only identifiable when the regressors vary (prefill chunks, verification steps,
batch and context changes); while the token counts do not, the last well-posed fit is kept; while
tokens and attention move together, the attention term is left out (c = 0, b takes both). Before
any fit, b = c = 0 and a is the mean step time: tokens look free, so speculation starts on and its
own steps supply the spread. A slope is never negative (a step never gets cheaper with more work).
"""

from __future__ import annotations

FORGET = 0.97  # weight of the past per observed step (half-life ~23 steps)
MIN_TOKEN_VARIANCE = 0.5  # tokens^2: below this spread the slope is noise; keep the last fit
MIN_INDEPENDENCE = 0.02  # 1 - correlation^2 of tokens and attention below which c is not identifiable


def attention_work(query_lens: list[int], seq_lens: list[int]) -> float:
    """Keys read by a step's query tokens: request r's q queries end at position seq_len - 1 and
    query i sees seq_len - q + i + 1 keys (causal), q * seq_len - q * (q - 1) / 2 in all."""
    return float(sum(q * s - q * (q - 1) // 2 for q, s in zip(query_lens, seq_lens)))


class StepCostModel:
    def __init__(self, forget: float = FORGET) -> None:
        self.forget = forget
        # Exponentially weighted sums of 1, n, w, t and their products.
        self._w1 = self._n = self._a = self._t = 0.0
        self._nn = self._aa = self._na = self._nt = self._at = 0.0
        self.a = 0.0  # seconds per step whatever its work
        self.b = 0.0  # seconds per scheduled token
        self.c = 0.0  # seconds per key read by attention

    @property
    def fitted(self) -> bool:
        return self._w1 > 0

    def observe(self, num_tokens: int, seconds: float, attention: float = 0.0) -> None:
        f = self.forget
        n, w, t = float(num_tokens), float(attention), float(seconds)
        self._w1 = f * self._w1 + 1.0
        self._n = f * self._n + n
        self._a = f * self._a + w
        self._t = f * self._t + t
        self._nn = f * self._nn + n * n
        self._aa = f * self._aa + w * w
        self._na = f * self._na + n * w
        self._nt = f * self._nt + n * t
        self._at = f * self._at + w * t
        k = self._w1
        mean_n, mean_w, mean_t = self._n / k, self._a / k, self._t / k
        var_n = self._nn / k - mean_n * mean_n
        if var_n >= MIN_TOKEN_VARIANCE:
            var_w = self._aa / k - mean_w * mean_w
            cov_nw = self._na / k - mean_n * mean_w
            cov_nt = self._nt / k - mean_n * mean_t
            cov_wt = self._at / k - mean_w * mean_t
            b, c = max(0.0, cov_nt / var_n), 0.0  # tokens alone
            det = var_n * var_w - cov_nw * cov_nw
            if var_w > 0 and det > MIN_INDEPENDENCE * var_n * var_w:
                b2 = (cov_nt * var_w - cov_wt * cov_nw) / det
                c2 = (cov_wt * var_n - cov_nt * cov_nw) / det
                if b2 >= 0 and c2 >= 0:
                    b, c = b2, c2
                elif c2 > 0:  # tokens explain nothing beyond attention
                    b, c = 0.0, max(0.0, cov_wt / var_w)
            self.b, self.c = b, c
        self.a = max(0.0, mean_t - self.b * mean_n - self.c * mean_w)

    def step_seconds(self, num_tokens: int, attention: float = 0.0) -> float:
        return self.a + self.b * num_tokens + self.c * attention

    def token_seconds(self, context_len: int) -> float:
        """What one more verified token at a context of context_len tokens adds to a step."""
        return self.b + self.c * (context_len + 1)
