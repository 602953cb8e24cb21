"""Start-up: reading a model folder, loading it, choosing its backend, calibrating and warming it
(`load.load_engine` is the entry point; the inference thread calls it)."""
