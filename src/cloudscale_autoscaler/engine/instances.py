"""Cloud state -> CA's Instance messages (pure)."""

from __future__ import annotations

from datetime import datetime

from cloudscale_autoscaler.cloud.models import Server
from cloudscale_autoscaler.engine.providerid import format_provider_id, placeholder_provider_id
from cloudscale_autoscaler.engine.records import ERROR_CLASS_OTHER, Placeholder
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

State = pb.InstanceStatus.InstanceState
RUNNING = pb.InstanceStatus.instanceRunning
CREATING = pb.InstanceStatus.instanceCreating
DELETING = pb.InstanceStatus.instanceDeleting
UNSPECIFIED = pb.InstanceStatus.unspecified

SERVER_ERROR_CODE = "SERVER_STATUS_ERROR"
_RUNNING_STATUSES = frozenset({"running", "stopped", "paused"})
# A server still `changing` this long after its creation is not booting: it is being resized,
# rebooted or deleted by someone else. CA's default max-node-provision-time.
BOOT_WINDOW_SECONDS = 15 * 60


def booting(server: Server, now_unix: float) -> bool:
    """Whether a `changing` server is still within its boot (an unreadable created_at counts
    as booting, the answer CA got before this rule)."""
    try:
        created = datetime.fromisoformat(server.created_at).timestamp()
    except ValueError:
        return True
    return now_unix - created < BOOT_WINDOW_SECONDS


def server_state(status: str, is_booting: bool) -> State:
    """A cloudscale server status as CA's instance state (without our own deletions)."""
    if status == "changing":
        return CREATING if is_booting else RUNNING
    if status == "error":
        return CREATING
    if status in _RUNNING_STATUSES or status.startswith("rescue_"):
        return RUNNING
    return UNSPECIFIED


def server_instance(server: Server, deleting: bool, is_booting: bool) -> pb.Instance:
    instance_id = format_provider_id(server.uuid)
    if deleting:
        return pb.Instance(id=instance_id, status=pb.InstanceStatus(instanceState=DELETING))
    state = server_state(server.status, is_booting)
    status = pb.InstanceStatus(instanceState=state)
    if server.status == "error":
        # Creating + errorCode = a failed creation to CA: it backs off and deletes the server.
        status.errorInfo.CopyFrom(
            pb.InstanceErrorInfo(
                errorCode=SERVER_ERROR_CODE,
                errorMessage=f"server {server.name} ({server.uuid}) has status error",
                instanceErrorClass=ERROR_CLASS_OTHER,
            )
        )
    return pb.Instance(id=instance_id, status=status)


def acked_instance(uuid: str) -> pb.Instance:
    """A server the API acknowledged that no listing has shown yet."""
    return pb.Instance(
        id=format_provider_id(uuid), status=pb.InstanceStatus(instanceState=CREATING)
    )


def placeholder_instance(placeholder: Placeholder) -> pb.Instance:
    return pb.Instance(
        id=placeholder_provider_id(placeholder.ident),
        status=pb.InstanceStatus(
            instanceState=CREATING,
            errorInfo=pb.InstanceErrorInfo(
                errorCode=placeholder.code,
                errorMessage=placeholder.message,
                instanceErrorClass=placeholder.error_class,
            ),
        ),
    )
