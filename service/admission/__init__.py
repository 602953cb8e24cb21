"""Admission: what is admitted, held, shed or refused before any work. One policy object per
server (`policy.AdmissionPolicy`) that the edge and the app call; the tarpit, the shed budget,
the API key check and the refusals the edge answers itself are its parts."""
