"""The HTTP edge: connections, framing and head limits (`bounded`, `framing`, `head_deadline`),
admission from the request head (`edge`, asking `service.admission`), the admission policy's
gate in the app (`gate`), and the request context (`context`)."""
