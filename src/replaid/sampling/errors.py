"""A request's errors name its fields; each front end says them in its own words.

A message about a :class:`~replaid.sampling.request.SampleRequest` refers to a field with :func:`ref`
(``f"{ref('steps')} {n}: must be >= 1"``) and is raised as :class:`RequestError`. Its ``str`` names the
command-line flag (``--steps 0: must be >= 1``: what ``replaid sample`` / ``replaid edit`` print), by
:func:`flag`: ``--`` and the field with dashes, except the few of :data:`FLAGS`; :meth:`RequestError.named`
says the field as the request names it (``steps 0: must be >= 1``: the playground and the HTTP API, whose
JSON holds those fields; :meth:`RequestError.render`: any other naming). A new field needs no entry here
unless its flag breaks that rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from replaid.config import ConfigError

_MARK = "\x1f"  # a field reference inside a message: \x1f name \x1f (never shown)
_REF = re.compile(f"{_MARK}([a-z_]+){_MARK}")

# the fields whose command-line flag is not ``--`` + the field with dashes (replaid sample / replaid edit)
FLAGS = {
    "edit": "--text",  # replaid edit --text
    "edit_chars": "--span",
    "edit_span": "--token-span",
    "self_cond": "--no-self-cond",
}


def ref(field: str) -> str:
    """A reference to request field ``field`` inside a :class:`RequestError` message."""
    return f"{_MARK}{field}{_MARK}"


def flag(field: str) -> str:
    """The command-line flag of request field ``field``."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


class RequestError(ConfigError):
    """A request that cannot be sampled (one line); its fields said as the command line's flags (``str``),
    as the request names them (:meth:`named`) or by any other naming (:meth:`render`)."""

    def render(self, name: Callable[[str], str]) -> str:
        return _REF.sub(lambda m: name(m.group(1)), super().__str__())

    def __str__(self) -> str:
        return self.render(flag)

    def named(self) -> str:
        return self.render(lambda f: f)

    @property
    def fields(self) -> list[str]:
        """The fields the message names, in order (the first: what to fix)."""
        return _REF.findall(super().__str__())
