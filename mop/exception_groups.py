"""Exception groups (what trio's nurseries raise) seen as the plain exceptions inside them."""

from __future__ import annotations


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions that are not groups, from `exc` and every group nested in it."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]
