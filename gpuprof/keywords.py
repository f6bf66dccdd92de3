"""A misspelled keyword option names the closest valid one.

``gpuprof.profile(trace_evry_n_steps=50)`` raises ``TypeError:
gpuprof.profile() got an unexpected keyword argument 'trace_evry_n_steps';
did you mean 'trace_every_n_steps'?`` instead of Python's bare message.
The check is a set difference per call; :mod:`difflib` is imported only to
word the error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def unknown_keyword_message(name: str, keyword: str, valid: Sequence[str]) -> str:
    """``NAME() got an unexpected keyword argument 'KEYWORD'`` and the
    closest of *valid* (:func:`difflib.get_close_matches`, cutoff 0.6), or
    every valid option when none is close."""
    import difflib

    close = difflib.get_close_matches(keyword, valid, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "its options are " + ", ".join(valid)
    return f"{name}() got an unexpected keyword argument {keyword!r}; {hint}"


def check_keywords(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function whose keyword arguments are all named: an unknown
    one raises :class:`TypeError` naming the closest valid one (see
    :func:`unknown_keyword_message`; *name* is how the message calls the
    function, e.g. ``"gpuprof.profile"``). ``inspect.signature`` and
    ``help()`` still show the function's own parameters (``__wrapped__``)."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        code = func.__code__
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        options = [n for n in names if n not in ("self", "run_name")]
        valid = frozenset(names)

        @functools.wraps(func)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            unknown = kwargs.keys() - valid
            if unknown:
                raise TypeError(unknown_keyword_message(name, min(unknown), options))
            return func(*args, **kwargs)

        return checked

    return decorate
