"""draftgate scenarios package."""
