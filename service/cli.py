"""The `pipeline-server` command line: `serve` (the default) validates the settings, then execs
gunicorn; `export` writes the model folder's own ONNX graph (`service.bake`), e.g. in an
image's model stage. Every setting is also a flag (`--model-id` for `MODEL_ID`); a flag wins
over its environment variable.

exec (not a child process) keeps gunicorn as PID 1 in a container, so SIGTERM reaches it.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata
from typing import NoReturn

from service.engine.loading.cpu_threads import set_openmp_wait
from service.engine.loading.load import preflight
from service.settings import (
    SettingsError,
    export_flags,
    library_defaults,
    process_settings,
    setting_names,
)

PROG = "pipeline-server"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A wrong flag: one line, exit 2."""
        self.exit(2, f"{self.prog}: {message} (see {PROG} --help)\n")


def parser() -> argparse.ArgumentParser:
    """`pipeline-server [serve|export] [--setting VALUE ...]`."""
    top = _Parser(prog=PROG, description="Serve one Hugging Face text-encoder model over HTTP.")
    top.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = top.add_subparsers(dest="command", metavar="{serve,export}", parser_class=_Parser)
    serve = commands.add_parser("serve", help="serve the model (the default)")
    export = commands.add_parser("export", help="write the model's ONNX graph beside it")
    for p in (top, serve, export):
        group = p.add_argument_group("settings (each also read from its environment variable)")
        for flag, env in setting_names().items():
            group.add_argument(
                flag, dest=env, metavar="VALUE", default=argparse.SUPPRESS, help=f"${env}"
            )
    return top


def _version() -> str:
    try:
        return metadata.version("pipeline-server")
    except metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, check the settings and the model folder, then serve or export."""
    args = vars(parser().parse_args(sys.argv[1:] if argv is None else argv))
    command = args.pop("command", None) or "serve"
    export_flags(args)  # only the flags given (argparse.SUPPRESS leaves the others out)
    try:
        settings = process_settings()  # fail here, in one line, before gunicorn starts
        preflight(settings)
    except (SettingsError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        sys.exit(2)
    if command == "export":
        from service import bake

        try:
            bake.main(settings)
        except (ValueError, OSError) as exc:
            print(f"{PROG} export: {exc}", file=sys.stderr)
            sys.exit(1)
        return
    # Tokenizers' Rust thread pool is unsafe across fork (gunicorn forks the worker).
    library_defaults({"TOKENIZERS_PARALLELISM": "false"})
    set_openmp_wait()  # torch's threads' spin; before the worker imports torch (libgomp)
    argv_ = [sys.executable, "-m", "gunicorn", "--config", "python:service.gunicorn_conf"]
    os.execv(sys.executable, argv_)


if __name__ == "__main__":
    main()
