"""The HTTP edge: connections, framing and head limits, shedding from the
request head, the request context and the refusals answered without the app."""
