"""The HTTP edge: connections, framing and head limits (`edge`, `framing`), shedding from the
request head (`shed_gate`), and the request context (`context`)."""
