"""What a failed create means for the rest of its batch and for CA (pure).

Errors are sorted by what a retry could fix:
- resource refusals (quota, zone capacity): another group or a later try may succeed. CA must
  see them as failed instances of class OutOfResources (so it backs this group off and tries
  others), however fast the API refused;
- permanent refusals (rejected token, a request the API will never accept: unknown image,
  invalid field): no retry and no other group can fix them. The RPC fails with a precise code
  and the API's own text;
- everything else (5xx, timeouts, rate limits after the client's retries): transient,
  UNAVAILABLE.
Both resource and permanent refusals stop the batch: the creates not yet sent would be refused
just the same.
"""

from __future__ import annotations

from cloudscale_autoscaler.cloud.errors import (
    AuthenticationError,
    CloudError,
    InvalidRequestError,
    NotFoundError,
)
from cloudscale_autoscaler.engine.errors import (
    CloudUnavailable,
    EngineError,
    FailedPrecondition,
    PermissionDenied,
)


def is_permanent(error: CloudError) -> bool:
    return isinstance(error, AuthenticationError | InvalidRequestError | NotFoundError)


def stops_batch(error: CloudError) -> bool:
    """Whether the creates of the same batch not yet sent would certainly fail too."""
    return error.out_of_resources or is_permanent(error)


def fails_the_rpc(error: CloudError) -> bool:
    """Whether a batch refused entirely with `error` within the wait fails IncreaseSize;
    resource refusals never do: they reach CA as OutOfResources placeholders."""
    return not error.out_of_resources


def rpc_error(error: CloudError, message: str) -> EngineError:
    """The engine error (hence gRPC code) a refusal reaches CA with."""
    if isinstance(error, AuthenticationError):
        return PermissionDenied(message)
    if is_permanent(error):
        return FailedPrecondition(message)
    return CloudUnavailable(message)
