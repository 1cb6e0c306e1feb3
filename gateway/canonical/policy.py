"""Canonicalization policies: how far the gateway may rewrite a prompt to make prefixes repeat.

- off: the prompt is rendered exactly as sent.
- safe (the default): only rewrites that keep the meaning: whitespace and Unicode normal form
  in system prompts, tools and JSON keys in a fixed order, tool-call arguments re-serialized,
  empty reasoning blocks dropped, volatile values (timestamps, ids, nonces) moved out of the
  cacheable prefix into a short note at the end of the prompt.
- aggressive: safe, but volatile values in system prompts are stripped instead of moved.

The server's policy (`draftgate serve --canonicalization`) is a ceiling: a request may narrow it
with the `x-draftgate-canonicalization` header (e.g. "off" to see its prompt rendered verbatim),
never widen it.
"""

from __future__ import annotations

import enum

POLICY_HEADER = "x-draftgate-canonicalization"


class Policy(enum.IntEnum):
    OFF = 0
    SAFE = 1
    AGGRESSIVE = 2

    @property
    def label(self) -> str:
        return self.name.lower()


POLICY_NAMES = tuple(policy.label for policy in Policy)


def parse_policy(text: str, param: str = "canonicalization") -> Policy:
    """"off" / "safe" / "aggressive" (any case) -> Policy; ValueError naming `param` otherwise."""
    try:
        return Policy[text.strip().upper()]
    except KeyError:
        raise ValueError(f"{param} must be one of {', '.join(POLICY_NAMES)}; got {text!r}") from None


def narrow(server_policy: Policy, requested: str | None) -> Policy:
    """The policy for one request: the header's value when it is no wider than the server's."""
    if requested is None:
        return server_policy
    return min(server_policy, parse_policy(requested, POLICY_HEADER))
