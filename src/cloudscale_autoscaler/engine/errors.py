"""Engine errors. The service layer maps each class to one gRPC status code."""

from __future__ import annotations


class EngineError(Exception):
    """Base class; the message is shown to CA (and to the user in CA's logs) as is."""


class GroupNotFound(EngineError):
    """No node group with that id is configured (NOT_FOUND)."""


class InvalidArgument(EngineError):
    """The request itself is malformed: a delta of the wrong sign, no nodes (INVALID_ARGUMENT)."""


class FailedPrecondition(EngineError):
    """Valid request the group's state refuses: above max, below min, foreign node
    (FAILED_PRECONDITION)."""


class PermissionDenied(EngineError):
    """The cloud API rejected the token or its permissions (PERMISSION_DENIED): no retry helps
    until the token is fixed."""


class CloudUnavailable(EngineError):
    """The cloud API failed the operation (UNAVAILABLE); the message carries the API's text."""


class Unimplemented(EngineError):
    """The feature is deliberately absent for this group or RPC (UNIMPLEMENTED): CA then
    treats it as not provided (GetOptions, TemplateNodeInfo, pricing)."""
