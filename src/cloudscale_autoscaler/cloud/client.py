"""The cloudscale.ch REST API client: the `Cloud` protocol on one pooled httpx.AsyncClient.

Reliability rules, in short:
- GET, DELETE and PATCH of tags are idempotent: retried with full-jitter exponential backoff
  on 429 (with Retry-After as a floor), 500/502/503/504, connection errors and timeouts.
- A create (of a server or a server group) is never blindly re-sent. It is retried at once only
  when the API provably never processed it (429, or no connection was ever made); after any
  other failure (timeout, lost response, 5xx from a proxy) we first list servers (server
  groups) by the create's unique request tag and return the one found; only a listing that
  proves absence allows a re-send. After a timeout no listing proves absence: the API lists a
  server only once its create has been carried out, and it may still be carrying it out, so
  such a create is looked for until it appears or the retries run out, never sent again.
- Every HTTP attempt passes the optional client-side token bucket; creates and deletes also
  hold a slot of a global concurrency bound for their whole duration.
- Every HTTP attempt is abandoned `timeout_seconds` after it began, whatever phase it is in
  (httpx's own timeouts are per phase), and a create's fence is asked right before each of its
  attempts: so no create request of a replica leaves later than `timeout_seconds` after its
  fence closed (docs/deployment.md derives the journal's adoption bound from this).
- The token only ever lives in the Authorization header; error texts are redacted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import ssl
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from types import TracebackType
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlsplit

import httpx

from cloudscale_autoscaler import __version__
from cloudscale_autoscaler.cloud.errors import (
    CloudError,
    FencedError,
    NotFoundError,
    OutcomeUnknownError,
    UnavailableError,
)
from cloudscale_autoscaler.cloud.httperrors import error_from_response, redact
from cloudscale_autoscaler.cloud.models import (
    TAG_CLUSTER,
    TAG_REQUEST,
    Flavor,
    Image,
    Network,
    Region,
    Server,
    ServerGroup,
    ServerSpec,
    Subnet,
)
from cloudscale_autoscaler.cloud.parse import (
    decode,
    decode_servers,
    parse_flavors,
    parse_images,
    parse_networks,
    parse_regions,
    parse_server,
    parse_server_group,
    parse_server_groups,
    parse_subnets,
)
from cloudscale_autoscaler.cloud.protocol import Fence
from cloudscale_autoscaler.cloud.ratelimit import (
    ConcurrencyLimit,
    TokenBucket,
    backoff_delay,
    parse_retry_after,
)
from cloudscale_autoscaler.settings.types import CloudscaleConfig

logger = logging.getLogger(__name__)

USER_AGENT = f"cloudscale-autoscaler/{__version__}"
RequestObserver = Callable[[str, str, float], None]
T = TypeVar("T")
# What a create makes (and a listing by cluster returns): both carry tags.
Made = TypeVar("Made", Server, ServerGroup)

# Statuses worth another try for idempotent calls (a 500 may be a transient backend error).
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
# Bad gateway and gateway timeout: a proxy gave up on the API, which may still be at work.
GATEWAY_STATUSES = frozenset({502, 504})
# No retry delay (backoff or Retry-After) ever exceeds this; adjustable per client instance.
MAX_DELAY_SECONDS = 30.0
# The lookups that resolve an uncertain create show up under these operation names.
LOOKUP_OPERATION = "create_server_lookup"
GROUP_LOOKUP_OPERATION = "create_server_group_lookup"
# The only server group type the API offers.
SERVER_GROUP_TYPE = "anti-affinity"
# Raised before any byte of the request left: re-sending cannot duplicate anything.
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class _Outcome(Enum):
    REFUSED = "refused"  # the API provably did not act on it: safe to re-send
    UNSURE = "unsure"  # the API answered, so it is done with it: look before re-sending
    IN_DOUBT = "in doubt"  # no answer from the API: it may still be at work, so never re-send
    FINAL = "final"  # a definitive answer: do not retry


@dataclass(frozen=True)
class _Creatable(Generic[Made]):
    """What creating one kind of object takes: its collection, how to read one and a listing
    of them, and the operation names its requests show up under."""

    what: str  # "server", "server group": for messages
    path: str  # the collection: POST creates, GET lists (tag filters)
    operation: str
    lookup_operation: str
    parse: Callable[[Any, str], Made]
    parse_listing: Callable[[bytes, str], list[Made]]


def _decode_server_groups(content: bytes, operation: str) -> list[ServerGroup]:
    return decode(content, lambda body: parse_server_groups(body, operation))


_SERVERS = _Creatable(
    "server", "servers", "create_server", LOOKUP_OPERATION, parse_server, decode_servers
)
_SERVER_GROUPS = _Creatable(
    "server group",
    "server-groups",
    "create_server_group",
    GROUP_LOOKUP_OPERATION,
    parse_server_group,
    _decode_server_groups,
)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's own default (certifi's CAs, or SSL_CERT_FILE / SSL_CERT_DIR), made once per
    process: reading the CA bundle took 25 ms per client (check-config, smoke and tests
    make many)."""
    return httpx.create_ssl_context()


def _transport_error(exc: Exception, operation: str, secrets: tuple[str, ...]) -> CloudError:
    detail = redact(str(exc), secrets)
    what = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return UnavailableError(f"no response ({what})", None, operation)


def _of_cluster(listed: list[Made], cluster: str, what: str) -> list[Made]:
    """The server-side tag filter is trusted for volume, not for correctness."""
    mine = [item for item in listed if item.tags.get(TAG_CLUSTER) == cluster]
    if len(mine) != len(listed):
        logger.warning(
            "cloudscale API returned %d %s not tagged %s=%s despite the tag filter; ignored them",
            len(listed) - len(mine),
            what,
            TAG_CLUSTER,
            cluster,
        )
    return mine


def _check_options(
    url: str,
    token: str,
    timeout_seconds: float,
    max_concurrent_mutations: int,
    requests_per_second: float | None,
    flavor_ttl_seconds: float,
    max_retries: int,
    backoff_base: float,
) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url: expected http(s)://host[:port]/v1, got {url!r}")
    # Never echo the token, only say what is wrong with it.
    if any(not ch.isprintable() or ch.isspace() or ord(ch) > 126 for ch in token):
        raise ValueError("token: contains whitespace or non-ASCII characters (value not shown)")
    checks: list[tuple[str, float | None, bool, str]] = [
        ("timeout_seconds", timeout_seconds, timeout_seconds > 0, "> 0"),
        ("max_concurrent_mutations", max_concurrent_mutations, max_concurrent_mutations > 0, "> 0"),
        (
            "requests_per_second",
            requests_per_second,
            requests_per_second is None or requests_per_second > 0,
            "> 0 or None",
        ),
        ("flavor_ttl_seconds", flavor_ttl_seconds, flavor_ttl_seconds >= 0, ">= 0"),
        ("max_retries", max_retries, max_retries >= 0, ">= 0"),
        ("backoff_base", backoff_base, backoff_base >= 0, ">= 0"),
    ]
    for name, value, ok, expected in checks:
        if not ok:
            raise ValueError(f"{name}: expected {expected}, got {value!r}")


class CloudscaleClient:
    """Implements cloud.protocol.Cloud against the cloudscale.ch API (or the emulator)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_seconds: float = 30.0,
        max_concurrent_mutations: int = 10,
        requests_per_second: float | None = None,
        flavor_ttl_seconds: float = 300.0,
        max_retries: int = 5,
        backoff_base: float = 0.2,
        on_request: RequestObserver | None = None,
    ) -> None:
        _check_options(
            url,
            token,
            timeout_seconds,
            max_concurrent_mutations,
            requests_per_second,
            flavor_ttl_seconds,
            max_retries,
            backoff_base,
        )
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.max_delay_seconds = MAX_DELAY_SECONDS
        self.flavor_ttl_seconds = flavor_ttl_seconds
        # Retries per operation name; a resolved lost create response also counts under
        # "create_server_recovered" ("create_server_group_recovered").
        self.retries: dict[str, int] = {}
        self._on_request = on_request
        self._secrets = (token,) if token else ()
        # Backoff jitter, seeded from the process's generator (random.seed replays it).
        self._rng = random.Random(random.getrandbits(64))
        self.rate_limiter = TokenBucket(requests_per_second) if requests_per_second else None
        self.mutations = ConcurrencyLimit(max_concurrent_mutations)
        self._flavors: list[Flavor] | None = None
        self._flavors_expire = 0.0
        # (time.monotonic(), error) of the latest attempt that failed and is being retried.
        self._retrying_after: tuple[float, CloudError] | None = None
        self._flavor_fetch: asyncio.Task[list[Flavor]] | None = None
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # Reads are not bounded by the mutation limit, so leave them room in the pool too.
        pool = max_concurrent_mutations + 20
        self._http = httpx.AsyncClient(
            base_url=self.url + "/",
            verify=_tls_context(),
            headers=headers,
            timeout=httpx.Timeout(timeout_seconds),
            limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
            follow_redirects=False,
        )

    @classmethod
    def from_config(
        cls, config: CloudscaleConfig, *, on_request: RequestObserver | None = None
    ) -> CloudscaleClient:
        token = config.token
        if not token and config.token_file is not None:
            token = config.token_file.read_text(encoding="utf-8").strip()
        return cls(
            config.url,
            token,
            timeout_seconds=config.timeout_seconds,
            max_concurrent_mutations=config.max_concurrent_creates,
            requests_per_second=config.requests_per_second,
            flavor_ttl_seconds=config.flavor_cache_seconds,
            on_request=on_request,
        )

    def __repr__(self) -> str:
        return f"CloudscaleClient(url={self.url!r})"

    async def __aenter__(self) -> CloudscaleClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._flavor_fetch is not None:
            self._flavor_fetch.cancel()
        await self._http.aclose()

    # ---- the Cloud protocol -------------------------------------------------------------

    async def list_servers(self, cluster: str) -> list[Server]:
        if not cluster:
            raise ValueError("cluster: expected a non-empty cluster name")
        operation = "list_servers"
        response = await self._call(
            operation, "GET", "servers", params={f"tag:{TAG_CLUSTER}": cluster}
        )
        servers = self._decode_servers(response, operation)
        return _of_cluster(servers, cluster, "servers")

    async def create_server(self, spec: ServerSpec, fence: Fence | None = None) -> Server:
        body = self._create_body(spec)
        async with self.mutations:
            return await self._create(body, _SERVERS, fence)

    async def set_tags(self, uuid: str, tags: dict[str, str]) -> None:
        if not uuid:
            raise ValueError("uuid: expected a server UUID, got an empty string")
        # PATCH replaces the whole tags object: the same body twice has one effect, so the
        # idempotent retries of _call are safe.
        await self._call(
            "patch_server",
            "PATCH",
            f"servers/{quote(uuid, safe='')}",
            json_body={"tags": tags},
            ok=(204, 200),
        )

    async def delete_server(self, uuid: str) -> None:
        if not uuid:
            raise ValueError("uuid: expected a server UUID, got an empty string")
        async with self.mutations:
            try:
                await self._call(
                    "delete_server", "DELETE", f"servers/{quote(uuid, safe='')}", ok=(204, 200)
                )
            except NotFoundError:
                # Already gone (possibly deleted by our own earlier, lost-response attempt).
                logger.info("server %s was already deleted", uuid)

    async def list_server_groups(self, cluster: str) -> list[ServerGroup]:
        if not cluster:
            raise ValueError("cluster: expected a non-empty cluster name")
        operation = "list_server_groups"
        response = await self._call(
            operation, "GET", "server-groups", params={f"tag:{TAG_CLUSTER}": cluster}
        )
        groups = self._decode(response, operation, parse_server_groups)
        return _of_cluster(groups, cluster, "server groups")

    async def create_server_group(
        self, name: str, zone: str, tags: dict[str, str], fence: Fence | None = None
    ) -> ServerGroup:
        if not name:
            raise ValueError("name: expected a non-empty server group name")
        if not zone:
            raise ValueError("zone: expected a zone slug (server groups are zonal)")
        tags = dict(tags)
        # As for servers: a lost response is resolved by listing groups by this tag.
        if not tags.get(TAG_REQUEST):
            tags[TAG_REQUEST] = uuidlib.uuid4().hex
        body = {"name": name, "type": SERVER_GROUP_TYPE, "zone": zone, "tags": tags}
        async with self.mutations:
            return await self._create(body, _SERVER_GROUPS, fence)

    async def delete_server_group(self, uuid: str) -> None:
        if not uuid:
            raise ValueError("uuid: expected a server group UUID, got an empty string")
        async with self.mutations:
            try:
                await self._call(
                    "delete_server_group",
                    "DELETE",
                    f"server-groups/{quote(uuid, safe='')}",
                    ok=(204, 200),
                )
            except NotFoundError:
                # Already gone (possibly deleted by our own earlier, lost-response attempt).
                logger.info("server group %s was already deleted", uuid)

    async def list_flavors(self) -> list[Flavor]:
        if self._flavors is not None and time.monotonic() < self._flavors_expire:
            return list(self._flavors)
        # Concurrent callers share one request instead of stampeding the API.
        if self._flavor_fetch is None:
            self._flavor_fetch = asyncio.create_task(self._fetch_flavors())
            self._flavor_fetch.add_done_callback(self._flavor_fetch_done)
        # Shielded: one caller being cancelled must not cancel everyone else's fetch.
        return list(await asyncio.shield(self._flavor_fetch))

    async def list_images(self) -> list[Image]:
        response = await self._call("list_images", "GET", "images")
        return self._decode(response, "list_images", parse_images)

    async def list_regions(self) -> list[Region]:
        response = await self._call("list_regions", "GET", "regions")
        return self._decode(response, "list_regions", parse_regions)

    async def list_networks(self) -> list[Network]:
        response = await self._call("list_networks", "GET", "networks")
        return self._decode(response, "list_networks", parse_networks)

    async def list_subnets(self) -> list[Subnet]:
        response = await self._call("list_subnets", "GET", "subnets")
        return self._decode(response, "list_subnets", parse_subnets)

    # ---- flavors cache ----------------------------------------------------------------------

    async def _fetch_flavors(self) -> list[Flavor]:
        response = await self._call("list_flavors", "GET", "flavors")
        flavors = self._decode(response, "list_flavors", parse_flavors)
        self._flavors = flavors
        self._flavors_expire = time.monotonic() + self.flavor_ttl_seconds
        return flavors

    def _flavor_fetch_done(self, task: asyncio.Task[list[Flavor]]) -> None:
        self._flavor_fetch = None
        if not task.cancelled():
            # Marks the exception retrieved even when every waiter was cancelled.
            task.exception()

    # ---- create ------------------------------------------------------------------------------

    @staticmethod
    def _create_body(spec: ServerSpec) -> dict[str, Any]:
        tags = dict(spec.tags)
        # A caller-chosen request id is kept so the caller can search for it later.
        if not tags.get(TAG_REQUEST):
            tags[TAG_REQUEST] = uuidlib.uuid4().hex
        body: dict[str, Any] = {
            "name": spec.name,
            "flavor": spec.flavor,
            "image": spec.image,
            "volume_size_gb": spec.volume_size_gb,
            "use_ipv6": spec.use_ipv6,
            "tags": tags,
        }
        # The API refuses `interfaces` together with the use_*_network flags.
        if spec.interfaces is not None:
            body["interfaces"] = [interface.to_json() for interface in spec.interfaces]
        else:
            body["use_public_network"] = spec.use_public_network
            body["use_private_network"] = spec.use_private_network
        # Optional fields are omitted rather than sent empty/null (the API rejects a null
        # ssh_keys; omitting means "none", as cloudscale's own SDKs do).
        if spec.zone:
            body["zone"] = spec.zone
        if spec.ssh_keys:
            body["ssh_keys"] = list(spec.ssh_keys)
        if spec.server_groups:
            body["server_groups"] = list(spec.server_groups)
        if spec.user_data is not None:
            body["user_data"] = spec.user_data
        return body

    async def _create(
        self, body: dict[str, Any], kind: _Creatable[Made], fence: Fence | None
    ) -> Made:
        request_id: str = body["tags"][TAG_REQUEST]
        unsure = False  # an earlier attempt may have created it
        in_doubt = False  # ... or may still be creating it: a lookup that misses it proves nothing
        error: CloudError | None = None
        retry = 0
        while True:
            if unsure:
                found = await self._lookup_created(request_id, kind)
                if isinstance(found, CloudError):
                    pass  # still unsure
                elif found is not None:
                    return self._recovered(found, body, kind)
                elif not in_doubt:
                    unsure = False  # proven absent: re-sending cannot duplicate
            retry_after: float | None = None
            if not unsure:
                refusal = fence() if fence is not None else None
                if refusal is not None:
                    raise self._fenced(body, kind, refusal)
                result = await self._send_create(body, kind)
                if not isinstance(result, tuple):
                    return result
                error, outcome, retry_after = result
                if outcome is _Outcome.FINAL:
                    raise error
                unsure = outcome in (_Outcome.UNSURE, _Outcome.IN_DOUBT)
                in_doubt = outcome is _Outcome.IN_DOUBT
            assert error is not None
            if retry >= self.max_retries:
                if unsure:
                    # Out of retries, but one last look can still turn a lost response
                    # into a success, or prove nothing was created.
                    found = await self._lookup_created(request_id, kind)
                    if isinstance(found, CloudError) or (found is None and in_doubt):
                        raise self._outcome_unknown(body, error, kind)
                    if found is not None:
                        return self._recovered(found, body, kind)
                raise error
            retry += 1
            await self._pause(kind.operation, retry, error, retry_after)

    async def _send_create(
        self, body: dict[str, Any], kind: _Creatable[Made]
    ) -> Made | tuple[CloudError, _Outcome, float | None]:
        operation = kind.operation
        try:
            response = await self._attempt(operation, "POST", kind.path, json_body=body)
        except _NEVER_SENT as exc:
            return _transport_error(exc, operation, self._secrets), _Outcome.REFUSED, None
        except httpx.RequestError as exc:
            # Sent (or partly) and unanswered: timed out, or the connection broke. The API
            # carries out what it received whether or not the client still listens, so
            # the create may be under way and a lookup that misses it proves nothing.
            return _transport_error(exc, operation, self._secrets), _Outcome.IN_DOUBT, None
        status = response.status_code
        if status in (200, 201):
            try:
                made = self._decode(response, operation, kind.parse)
            except CloudError as exc:
                # Created, but unreadable: the lookup by request tag can still find it.
                return exc, _Outcome.UNSURE, None
            if not made.tags:
                made = replace(made, tags=dict(body["tags"]))
            return made
        error = self._error(response, operation)
        if status == 429:
            return error, _Outcome.REFUSED, self._retry_after(response)
        if status in GATEWAY_STATUSES:
            # A proxy's answer: the API behind it may still be carrying the create out.
            return error, _Outcome.IN_DOUBT, None
        if status in RETRYABLE_STATUSES:
            return error, _Outcome.UNSURE, None
        return error, _Outcome.FINAL, None

    async def _lookup_created(
        self, request_id: str, kind: _Creatable[Made]
    ) -> Made | CloudError | None:
        """One listing by request tag: what the create made, None if provably absent, or the
        error."""
        operation = kind.lookup_operation
        try:
            response = await self._attempt(
                operation, "GET", kind.path, params={f"tag:{TAG_REQUEST}": request_id}
            )
        except httpx.RequestError as exc:
            return _transport_error(exc, operation, self._secrets)
        if response.status_code != 200:
            return self._error(response, operation)
        try:
            listed = self._read(response, operation, lambda c: kind.parse_listing(c, operation))
        except CloudError as exc:
            return exc
        matches = [m for m in listed if m.tags.get(TAG_REQUEST) == request_id]
        if len(matches) > 1:
            logger.error(
                "create request %s produced %d %ss: %s",
                request_id,
                len(matches),
                kind.what,
                ", ".join(m.uuid for m in matches),
            )
        return matches[0] if matches else None

    def _recovered(self, made: Made, body: dict[str, Any], kind: _Creatable[Made]) -> Made:
        counter = f"{kind.operation}_recovered"
        self.retries[counter] = self.retries.get(counter, 0) + 1
        logger.warning(
            "create of %s: response was lost but the %s exists (%s); using it",
            body["name"],
            kind.what,
            made.uuid,
        )
        return made

    @staticmethod
    def _outcome_unknown(
        body: dict[str, Any], error: CloudError, kind: _Creatable[Made]
    ) -> OutcomeUnknownError:
        return OutcomeUnknownError(
            f"create of {body['name']}: outcome unknown, the {kind.what} may exist with tag "
            f"{TAG_REQUEST}={body['tags'][TAG_REQUEST]}; last error: {error.message}",
            error.status,
            kind.operation,
        )

    @staticmethod
    def _fenced(body: dict[str, Any], kind: _Creatable[Made], refusal: str) -> FencedError:
        """The fence closed before an attempt. Attempts are only made when no earlier one can
        have created anything (the first, one refused, or one a lookup proved absent), so
        nothing was created and nothing more is sent."""
        return FencedError(f"create of {body['name']}: not sent: {refusal}", None, kind.operation)

    # ---- the request machinery ----------------------------------------------------------

    async def _call(
        self,
        operation: str,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json_body: dict[str, Any] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> httpx.Response:
        """An idempotent request with retries; returns the first `ok` response."""
        retry = 0
        while True:
            retry_after: float | None = None
            try:
                response = await self._attempt(
                    operation, method, path, params=params, json_body=json_body
                )
            except httpx.RequestError as exc:
                error = _transport_error(exc, operation, self._secrets)
            else:
                if response.status_code in ok:
                    return response
                error = self._error(response, operation)
                if response.status_code not in RETRYABLE_STATUSES:
                    raise error
                if response.status_code == 429:
                    retry_after = self._retry_after(response)
            if retry >= self.max_retries:
                raise error
            retry += 1
            await self._pause(operation, retry, error, retry_after)

    async def _attempt(
        self,
        operation: str,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json_body: dict[str, Any] | None = None,
    ) -> httpx.Response:
        """Exactly one HTTP exchange, paced by the rate limit and reported to on_request."""
        if self.rate_limiter is not None:
            await self.rate_limiter.acquire()
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_seconds):
                response = await self._http.request(method, path, params=params, json=json_body)
        except TimeoutError:
            self._observe(operation, "error", time.monotonic() - started)
            raise httpx.TimeoutException(
                f"no complete answer within {self.timeout_seconds:g}s"
            ) from None
        except httpx.RequestError:
            self._observe(operation, "error", time.monotonic() - started)
            raise
        seconds = time.monotonic() - started
        self._observe(operation, str(response.status_code), seconds)
        logger.debug(
            "cloudscale API %s %s: %d in %.3fs",
            method,
            path,
            response.status_code,
            seconds,
            extra={"operation": operation},
        )
        # httpx links a read response and its stream both ways; that cycle keeps the whole body
        # (tens of MB for a large listing) alive until a full garbage collection. The body is
        # read and the stream closed by now, so dropping the stream frees it on the last use.
        response.stream = httpx.ByteStream(b"")
        return response

    async def _pause(
        self, operation: str, retry: int, error: CloudError, retry_after: float | None
    ) -> None:
        self.retries[operation] = self.retries.get(operation, 0) + 1
        self._retrying_after = (time.monotonic(), error)
        delay = backoff_delay(
            retry, self.backoff_base, self.max_delay_seconds, self._rng, retry_after
        )
        logger.warning(
            "cloudscale API %s: retry %d/%d in %.2fs after: %s",
            operation,
            retry,
            self.max_retries,
            delay,
            error,
        )
        await asyncio.sleep(delay)

    def failed_since(self, since: float) -> CloudError | None:
        """The error of the latest attempt that failed and was retried, if it failed after
        `since` (time.monotonic())."""
        if self._retrying_after is None or self._retrying_after[0] < since:
            return None
        return self._retrying_after[1]

    def _observe(self, operation: str, status: str, seconds: float) -> None:
        if self._on_request is None:
            return
        try:
            self._on_request(operation, status, seconds)
        except Exception:
            # Metrics must never break API calls.
            logger.warning("on_request observer failed", exc_info=True)

    def _error(self, response: httpx.Response, operation: str) -> CloudError:
        return error_from_response(
            response.status_code, response.content, response.reason_phrase, operation, self._secrets
        )

    @staticmethod
    def _retry_after(response: httpx.Response) -> float | None:
        return parse_retry_after(response.headers.get("Retry-After"))

    def _decode(
        self, response: httpx.Response, operation: str, parse: Callable[[Any, str], T]
    ) -> T:
        return self._read(
            response,
            operation,
            lambda content: decode(content, lambda body: parse(body, operation)),
        )

    def _decode_servers(self, response: httpx.Response, operation: str) -> list[Server]:
        return self._read(response, operation, lambda content: decode_servers(content, operation))

    def _read(self, response: httpx.Response, operation: str, read: Callable[[bytes], T]) -> T:
        """`read` of the body; a body that is not JSON is a CloudError (one nested too deeply
        for the decoder too)."""
        try:
            return read(response.content)
        except (ValueError, RecursionError):
            snippet = redact(response.text[:200], self._secrets)
            raise CloudError(
                f"malformed API response: not JSON: {snippet!r}", response.status_code, operation
            ) from None
