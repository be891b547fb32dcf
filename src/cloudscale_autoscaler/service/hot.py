"""The answers the transport serves without calling Python: NodeGroups, GPULabel,
NodeGroupForNode, NodeGroupTargetSize, NodeGroupGetOptions, NodeGroupTemplateNodeInfo.

`HotAnswers.publish` serializes them from the service's and the engine's current state and
hands them to the transport, which swaps them in atomically. It runs after every forwarded
call, before that call's answer leaves (CA's next call must see what this one changed), and
when a background creation or deletion finished. Only what changed is published again: the
node index after a rebuild or an added entry, the target sizes when one moved, the templates
when Refresh rebuilt them or a call built one. A publish that fails withdraws all three, so the
servicer answers until one succeeds.

What is published is exactly what the servicer would answer; anything else (an unknown group,
the target of a group with failed-creation placeholders, whose expiry moves it with time
alone) is left out, and the transport forwards such calls here. GetOptions whose answer
depends on the defaults CA sends is answered here once per distinct request, then by the
transport from that answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from cloudscale_autoscaler.engine import options
from cloudscale_autoscaler.engine.errors import EngineError
from cloudscale_autoscaler.engine.inventory import NOT_MANAGED
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.service.provider import CloudProviderService, status_code

Published = bytes | tuple[int, str]


class AnswerSink(Protocol):
    def publish_node_index(self, index: Mapping[str, bytes], not_managed: bytes) -> None: ...

    def publish_answers(self, method: str, answers: Mapping[str, Published]) -> None: ...

    def withdraw(self, method: str) -> None: ...

    def memoize(self, method: str) -> None: ...


class HotAnswers:
    def __init__(self, service: CloudProviderService, sink: AnswerSink) -> None:
        self._engine = service.engine
        self._sink = sink
        # The index last published and its size (held, so its identity cannot be reused).
        self._index: Mapping[str, pb.NodeGroupForNodeResponse] | None = None
        self._index_size = -1
        self._targets: dict[str, int] | None = None
        # Likewise the templates last published (the engine's dict until Refresh drops it).
        self._templates: Mapping[str, pb.NodeGroupTemplateNodeInfoResponse] | None = None
        self._templates_size = -1
        self._service = service
        self._publish_config()
        # Where the answer depends on the defaults CA sends, it is still a pure function of
        # the request and the config: the transport keeps each answer for the exact request
        # bytes it was given for, until a reload withdraws them (reconfigured).
        sink.memoize("NodeGroupGetOptions")

    def _publish_config(self) -> None:
        """What follows from the config alone: NodeGroups, GPULabel, GetOptions."""
        for method, answer in self._service.constant_answers().items():
            self._sink.publish_answers(method, {"": answer.SerializeToString()})
        self._sink.publish_answers("NodeGroupGetOptions", self._options())

    def reconfigured(self) -> None:
        """After a config reload: every answer again, the memoized GetOptions dropped."""
        self._sink.withdraw("NodeGroupGetOptions")
        self._publish_config()
        self._index, self._index_size, self._targets = None, -1, None
        self._templates, self._templates_size = None, -1
        self.publish()

    def publish(self) -> None:
        try:
            self._publish()
        except Exception:
            # Answers that could not be refreshed must not be served stale: their calls go to
            # the servicer until a publish succeeds, which then publishes them all again.
            for method in _REFRESHED:
                self._sink.withdraw(method)
            self._index, self._index_size, self._targets = None, -1, None
            self._templates, self._templates_size = None, -1
            raise

    def _publish(self) -> None:
        index = self._engine.provider_index()
        if index is not self._index or len(index) != self._index_size:
            self._sink.publish_node_index(_serialized(index), _NOT_MANAGED)
            self._index, self._index_size = index, len(index)
        targets = self._engine.settled_targets()
        if targets != self._targets:
            answers: dict[str, Published] = {
                name: pb.NodeGroupTargetSizeResponse(targetSize=size).SerializeToString()
                for name, size in targets.items()
            }
            self._sink.publish_answers("NodeGroupTargetSize", answers)
            self._targets = targets
        templates = self._engine.built_templates()
        if templates is not self._templates or len(templates) != self._templates_size:
            built: dict[str, Published] = {
                name: response.SerializeToString() for name, response in templates.items()
            }
            self._sink.publish_answers("NodeGroupTemplateNodeInfo", built)
            self._templates, self._templates_size = templates, len(templates)

    def _options(self) -> dict[str, Published]:
        """GetOptions per group, where the answer does not depend on CA's defaults."""
        answers: dict[str, Published] = {}
        for group in self._engine.config.node_groups:
            overrides = group.autoscaling_options
            if overrides is not None and options.depends_on_defaults(overrides):
                continue
            try:
                response = self._engine.autoscaling_options(
                    group.name, pb.NodeGroupAutoscalingOptions()
                )
            except EngineError as error:
                answers[group.name] = (status_code(error).value, str(error))
            else:
                answers[group.name] = response.SerializeToString()
        return answers


_NOT_MANAGED = NOT_MANAGED.SerializeToString()
# The answers that follow the engine's state, republished as it changes.
_REFRESHED = ("NodeGroupForNode", "NodeGroupTargetSize", "NodeGroupTemplateNodeInfo")


def _serialized(index: Mapping[str, pb.NodeGroupForNodeResponse]) -> dict[str, bytes]:
    """The index with each group's answer serialized once (the entries share the objects)."""
    by_answer: dict[int, bytes] = {}
    out = {}
    for provider_id, answer in index.items():
        data = by_answer.get(id(answer))
        if data is None:
            data = by_answer[id(answer)] = answer.SerializeToString()
        out[provider_id] = data
    return out
