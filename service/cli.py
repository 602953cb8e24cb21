"""The `pipeline-server` console script: validate the settings, then exec gunicorn.

exec (not a child process) keeps gunicorn as PID 1 in a container, so SIGTERM reaches it.
"""

from __future__ import annotations

import os
import sys

from service.engine.loading.cpu_threads import set_openmp_wait
from service.engine.loading.load import preflight
from service.settings import SettingsError, load_settings


def main() -> None:
    """`pipeline-server`: serve; `pipeline-server export`: write the model folder's own ONNX
    graph (`service.bake`), e.g. in an image's model stage."""
    try:
        settings = load_settings()  # fail here, in one line, before gunicorn starts
        preflight(settings)
    except (SettingsError, ValueError) as exc:
        print(f"pipeline-server: {exc}", file=sys.stderr)
        sys.exit(2)
    if sys.argv[1:] == ["export"]:
        from service import bake

        try:
            bake.main(settings)
        except (ValueError, OSError) as exc:
            print(f"pipeline-server export: {exc}", file=sys.stderr)
            sys.exit(1)
        return
    # Tokenizers' Rust thread pool is unsafe across fork (gunicorn forks the worker).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_openmp_wait()  # torch's threads' spin; before the worker imports torch (libgomp)
    argv = [sys.executable, "-m", "gunicorn", "--config", "python:service.gunicorn_conf"]
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
