"""Wait in a page for a JavaScript condition without evaluating a string in it.

Playwright's ``page.wait_for_function`` builds its predicate with ``eval`` inside
the page, which the dashboard's Content-Security-Policy (no 'unsafe-eval')
refuses. ``page.evaluate`` runs over the DevTools protocol, outside the page's
CSP, so polling it keeps the policy on while a test waits.
"""

from __future__ import annotations

import time
from typing import Any

POLL_S = 0.05


def wait_until(page: Any, js: str, arg: Any = None, timeout: float = 30_000) -> Any:
    """Poll ``page.evaluate(js, arg)`` until it is truthy; return that value.

    *js* is an expression or a function source; *timeout* is in ms, as in
    Playwright. Raises AssertionError naming *js* and its last value on timeout.
    """
    deadline = time.monotonic() + timeout / 1000
    while True:
        value = page.evaluate(js, arg)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout:.0f} ms: {js} (last: {value!r})")
        page.wait_for_timeout(POLL_S * 1000)
