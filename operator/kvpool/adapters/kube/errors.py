"""The errors of Kubernetes API calls, typed by what the caller does about them.

Why it exists: callers branch on a few answers - an object that is not there, a write that
lost a race (409: someone changed the object first) - and comparing a bare status code at
each call site spread that knowledge around. :class:`NotFoundError` and :class:`ConflictError` are
:class:`ApiError` subclasses, so ``except ApiError`` still catches every failed call.
"""

from __future__ import annotations


class ApiError(Exception):
    """An API answer the caller must handle (after retries); ``status`` 0: no answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class NotFoundError(ApiError):
    """404: the object (or its namespace, or the resource) does not exist."""

    def __init__(self, message: str) -> None:
        super().__init__(404, message)


class ConflictError(ApiError):
    """409: the object already exists, or changed since the resourceVersion sent."""

    def __init__(self, message: str) -> None:
        super().__init__(409, message)


def api_error(status: int, message: str) -> ApiError:
    """The typed error for an answer's status."""
    if status == 404:
        return NotFoundError(message)
    if status == 409:
        return ConflictError(message)
    return ApiError(status, message)
