"""Constrained decoding through llguidance.

grammars.py builds and checks grammars (torch-free and tokenizer-free, so the gateway uses it to
refuse a bad schema with a 400 before anything reaches the engine); matcher.py keeps one matcher
per constrained request in the engine and turns its state into a token bitmask per step.
"""
