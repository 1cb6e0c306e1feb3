"""draftgate gateway package."""
