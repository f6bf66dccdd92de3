"""The one bounded walk over a module tree (the forward detector's root
checks, the comm timer's DDP search). Needs no torch: it reads
``_modules`` directly, which costs ~10x less than ``Module.modules()``
(no generators nested per level, no memo set)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

#: Most modules walked in one tree: a model far larger than any real one
#: (a 1000-layer transformer has ~10k modules) stops here instead of taking
#: the training thread for long.
MAX_WALK = 10_000


class ModuleWalk:
    """Iterate *root* and its submodules depth-first, at most *limit* of them.

    Args:
        root: a ``torch.nn.Module`` (anything else is yielded alone).
        limit: most modules yielded; :attr:`truncated` says if more were left.
        descend: called with each yielded module; False: its children are
            not walked (e.g. nothing inside a DDP).
    """

    __slots__ = ("root", "limit", "descend", "truncated")

    def __init__(
        self,
        root: Any,
        limit: int = MAX_WALK,
        descend: Callable[[Any], bool] | None = None,
    ) -> None:
        self.root = root
        self.limit = limit
        self.descend = descend
        #: True once the walk stopped at *limit* with modules left unseen.
        self.truncated = False

    def __iter__(self) -> Iterator[Any]:
        stack = [self.root]
        descend = self.descend
        for _ in range(self.limit):
            if not stack:
                return
            m = stack.pop()
            yield m
            if descend is not None and not descend(m):
                continue
            children = getattr(m, "_modules", None)
            if isinstance(children, dict):
                stack.extend(c for c in children.values() if c is not None)
        self.truncated = bool(stack)
