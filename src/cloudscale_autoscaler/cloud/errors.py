"""Typed cloud errors: they keep the HTTP status and the API's own message, never the token."""

from __future__ import annotations


class CloudError(Exception):
    """A failed cloud API call.

    `status` is the HTTP status (None when no response arrived), `message` the API's own text
    (DRF `detail` or field errors), `code` a stable upper-case code for CA's InstanceErrorInfo.
    """

    code = "CLOUD_ERROR"
    # Quota and capacity errors map to CA's OutOfResources error class.
    out_of_resources = False

    def __init__(self, message: str, status: int | None = None, operation: str = "") -> None:
        self.message = message
        self.status = status
        self.operation = operation
        where = f"{operation}: " if operation else ""
        shown = f"HTTP {status}: " if status is not None else ""
        super().__init__(f"{where}{shown}{message}")


class AuthenticationError(CloudError):
    code = "AUTHENTICATION_FAILED"


class NotFoundError(CloudError):
    code = "NOT_FOUND"


class InvalidRequestError(CloudError):
    """A 400 the API gave for the request's content (unknown flavor, invalid name, ...)."""

    code = "INVALID_REQUEST"


class QuotaExceededError(CloudError):
    code = "QUOTA_EXCEEDED"
    out_of_resources = True


class CapacityError(CloudError):
    """The zone has no capacity for the flavor."""

    code = "ZONE_CAPACITY_EXHAUSTED"
    out_of_resources = True


class RateLimitedError(CloudError):
    code = "RATE_LIMITED"


class UnavailableError(CloudError):
    """5xx, connection errors and timeouts once retries are exhausted."""

    code = "CLOUD_UNAVAILABLE"


class OutcomeUnknownError(UnavailableError):
    """A create was sent and no answer, lookup or retry could tell whether the API carried it
    out: the object may still appear, carrying the create's request tag."""

    code = "CREATE_OUTCOME_UNKNOWN"


class FencedError(CloudError):
    """A create was not sent: this replica may no longer send creates (its Lease lapsed)."""

    code = "NOT_LEADING"


class ServerGroupFullError(CloudError):
    """The server group named in a create already holds the most servers it may."""

    code = "SERVER_GROUP_FULL"


class ServerGroupGoneError(CloudError):
    """The server group named in a create does not exist (deleted behind our back)."""

    code = "SERVER_GROUP_NOT_FOUND"


class HostShortageError(CloudError):
    """No host is left that keeps the new server apart from its server group's members: the
    zone is out of room for this group, as for capacity."""

    code = "NO_DISTINCT_HOST"
    out_of_resources = True
