"""Admission: what the edge and the app decide before any work (the shed budget, the refusals the
edge answers itself)."""
