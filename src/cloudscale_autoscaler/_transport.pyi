# The compiled transport (rust/src/lib.rs); used through cloudscale_autoscaler.transport.server.
from collections.abc import Callable, Mapping, Sequence
from typing import Any

MAX_RECEIVE_BYTES: int

class Reply:
    def ok(self, message: bytes) -> None: ...
    def error(self, code: int, message: str) -> None: ...

class Server:
    port: int
    def __init__(
        self,
        listen: str,
        methods: Sequence[str],
        buckets: Sequence[float],
        descriptors: bytes,
        tls: tuple[bytes, bytes, bytes] | None,
        hooks: Any,
        id_prefix: str,
    ) -> None: ...
    def set_tls(self, cert: bytes, key: bytes, client_ca: bytes) -> None: ...
    def set_debug(self, on: bool) -> None: ...
    def publish_node_index(self, index: Mapping[str, bytes], not_managed: bytes) -> None: ...
    def publish_answers(
        self, method: str, answers: Mapping[str, bytes | tuple[int, str]]
    ) -> None: ...
    def rpc_stats(self, method: int) -> tuple[list[int], list[int], float]: ...
    def stop(self, grace: float, on_stopped: Callable[[], None]) -> None: ...
