"""Speculative decoding: proposers of draft tokens, and their statistics.

The target verifies drafts in the same forward as everything else (drafted tokens are just more
tokens to catch up on, see engine/core/scheduler.py), and engine/sample/rejection_sampler.py keeps
the output exactly the target's. Proposers live with the model runner because the draft model
owns tensors; the suffix proposer is pure Python.
"""
