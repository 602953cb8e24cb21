"""The runtime on the event loop: readiness, draining, reading a body, submitting
units and awaiting their answers (the loop side of the hand-off)."""
