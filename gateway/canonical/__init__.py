"""Prompt canonicalization: rewrite what agent frameworks send so that prefixes repeat.

policy.py (off / safe / aggressive), rules.py (one small pure rule each), pipeline.py (the rules
in order plus the trailing volatile note), diagnostics.py (which canonical segment first
diverged from the session's previous request, and how many tokens were reusable).
See docs/canonicalization.md for a before/after example of every rule.
"""

from gateway.canonical.pipeline import CanonicalConversation, canonicalize
from gateway.canonical.policy import POLICY_HEADER, Policy, narrow, parse_policy

__all__ = ["POLICY_HEADER", "CanonicalConversation", "Policy", "canonicalize", "narrow", "parse_policy"]
