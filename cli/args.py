"""What every ``cdc`` command shares: :class:`CliError` (a coded error with its exit code) and the secrets and URIs
read from a flag, a file or the environment (so that no credential need be on the command line, where ``ps`` shows
it)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


class CliError(Exception):
    def __init__(self, code: str, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code


def read_secret_file(path: str, what: str) -> str:
    """The first line of ``path`` that is neither blank nor a ``#`` comment; :class:`CliError` (exit 2) when the
    file cannot be read or holds none."""
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines()]
    except OSError as exc:
        raise CliError("CDC:ErrInvalidConfig", f"cannot read the {what} file {path}: {exc.strerror or exc}", 2) from exc
    value = next((line for line in lines if line and not line.startswith("#")), "")
    if not value:
        raise CliError("CDC:ErrInvalidConfig", f"the {what} file {path} is empty", 2)
    return value


def uri_arg(args: argparse.Namespace, flag: str, env_name: str, what: str, required: bool) -> str | None:
    """A URI from ``--FLAG``, else ``--FLAG-file`` (first line), else ``$ENV_NAME``: the last two keep the
    credentials out of the command line (``ps``)."""
    value = getattr(args, flag, None)
    if value:
        return str(value)
    path = getattr(args, f"{flag}_file", None)
    if path:
        return read_secret_file(path, what)
    value = os.environ.get(env_name, "")
    if value:
        return value
    if required:
        raise CliError("CDC:ErrUsage", f"give the {what}: --{flag.replace('_', '-')}, "
                       f"--{flag.replace('_', '-')}-file FILE or ${env_name}", 2)
    return None
