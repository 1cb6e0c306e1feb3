"""Distillation data: stdlib sources, written prompts, target transcripts, the token corpus."""
