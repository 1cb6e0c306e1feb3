"""draftgate drafts package."""
