"""Errors the CLI turns into exit codes."""


class UserError(Exception):
    """Bad input: the CLI prints the message on one line and exits 2.

    Messages name the field and the fix, e.g. ``workload.prompts: file not found ...; fix: ...``.
    """
