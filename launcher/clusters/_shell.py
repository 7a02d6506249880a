"""Checks for config values that end up in generated scripts and command lines.

Every value is ``shlex.quote``d where it is written; quoting cannot help with two things, which
are refused here instead: a line break (it would end an ``#SBATCH`` comment line and start a
shell line) and a leading ``-`` where a name or path is expected (the tool would read it as an
option: ``container.image=--privileged``).
"""

from __future__ import annotations

import re

from launcher.errors import UserError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def one_line(key: str, value: object) -> str:
    """``value`` as a string that stays on one line of a script."""
    text = str(value)
    if _CONTROL.search(text):
        raise UserError(f"{key}={text!r}: line breaks and control characters are not allowed here")
    return text


def operand(key: str, value: object) -> str:
    """A name or path given to a tool as a positional argument: one line, not option-like."""
    text = one_line(key, value)
    if not text or text.startswith("-"):
        raise UserError(f"{key}={text!r}: expected a name or path, not an option (nor empty)")
    return text


def env_name(key: str, name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UserError(f"{key}: {name!r} is not a valid environment variable name (letters, digits, _)")
    return name
