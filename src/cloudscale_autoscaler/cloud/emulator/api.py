"""The /v1 REST API: handlers plus the pipeline every /v1 request runs through.

Pipeline order (each step can answer instead of the handler): down -> latency -> auth ->
rate_limit -> error_rate -> handler. A server create adds, after validation: fail_next_creates ->
zones_out_of_capacity -> host_shortage (creates naming a server group) -> quota -> create ->
lose_create_responses. A server delete of an existing server adds fail_next_deletes.
"""

from __future__ import annotations

import asyncio
import hmac

from aiohttp import web

from cloudscale_autoscaler.cloud.emulator.catalogue import (
    FLAVORS,
    FlavorSpec,
    flavors_body,
    images_body,
    regions_body,
)
from cloudscale_autoscaler.cloud.emulator.networks import networks_json, subnets_json
from cloudscale_autoscaler.cloud.emulator.records import ServerGroupRecord, ServerRecord
from cloudscale_autoscaler.cloud.emulator.responses import (
    NOT_FOUND,
    ApiError,
    Dropped,
    Handler,
    converted,
    detail,
    drop_connection,
    error_response,
    json_bytes,
    json_value,
    no_content,
    read_json,
)
from cloudscale_autoscaler.cloud.emulator.state import EmulatorState, TagFilter
from cloudscale_autoscaler.cloud.emulator.validation import (
    NewServer,
    validate_create,
    validate_patch,
    validate_server_group_create,
    validate_server_group_patch,
)

STATE = web.AppKey("emulator_state", EmulatorState)
TOKEN = web.AppKey("emulator_token", str)  # absent: any request is authenticated

NOT_PROVIDED = "Authentication credentials were not provided."
INVALID_TOKEN = "Invalid token."
_ERROR_DETAILS = {
    400: "Bad request.",
    500: "A server error occurred.",
    502: "Bad gateway.",
    503: "Service temporarily unavailable, try again later.",
    504: "Gateway timeout.",
}
# A gateway's timeout page: what a client sees when the API never answered the proxy.
_GATEWAY_TIMEOUT_HTML = (
    b"<html><head><title>504 Gateway Time-out</title></head>"
    b"<body><center><h1>504 Gateway Time-out</h1></center></body></html>"
)

_CATALOGUE = {"flavors": flavors_body(), "images": images_body(), "regions": regions_body()}


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/servers", list_servers, name="list_servers")
    app.router.add_post("/v1/servers", create_server, name="create_server")
    app.router.add_get("/v1/servers/{uuid}", get_server, name="get_server")
    app.router.add_delete("/v1/servers/{uuid}", delete_server, name="delete_server")
    app.router.add_patch("/v1/servers/{uuid}", patch_server, name="patch_server")
    app.router.add_get("/v1/flavors", list_flavors, name="list_flavors")
    app.router.add_get("/v1/images", list_images, name="list_images")
    app.router.add_get("/v1/regions", list_regions, name="list_regions")
    app.router.add_get("/v1/server-groups", list_server_groups, name="list_server_groups")
    app.router.add_post("/v1/server-groups", create_server_group, name="create_server_group")
    app.router.add_get("/v1/server-groups/{uuid}", get_server_group, name="get_server_group")
    app.router.add_patch("/v1/server-groups/{uuid}", patch_server_group, name="patch_server_group")
    app.router.add_delete(
        "/v1/server-groups/{uuid}", delete_server_group, name="delete_server_group"
    )
    app.router.add_get("/v1/networks", list_networks, name="list_networks")
    app.router.add_get("/v1/subnets", list_subnets, name="list_subnets")


def is_api_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


# ---- pipeline ------------------------------------------------------------------------------


async def handle_api_request(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    state.purge()
    endpoint = request.match_info.route.name
    if endpoint is None:  # no such route or method: DRF 404/405, not counted
        return await converted(request, handler)
    if request.method == "GET":
        return await _counted(request, handler, state, endpoint)
    # A real API carries out a change it received even if nobody waits for the answer any
    # more: read the whole body now (a client gone later must not fail the read) and shield
    # the handling from the connection's cancellation.
    try:
        await request.read()
    except web.HTTPException as exc:  # an oversized body: refused up front, as a proxy does
        return error_response(exc)
    task = asyncio.ensure_future(_counted(request, handler, state, endpoint))
    state.carried.add(task)
    task.add_done_callback(state.carried.discard)
    return await asyncio.shield(task)


async def _counted(
    request: web.Request, handler: Handler, state: EmulatorState, endpoint: str
) -> web.StreamResponse:
    state.in_flight[endpoint] = state.in_flight.get(endpoint, 0) + 1
    try:
        response = await converted(request, lambda r: _faulty(r, handler, state, endpoint))
    finally:
        state.in_flight[endpoint] -= 1
    outcome = response.outcome if isinstance(response, Dropped) else str(response.status)
    state.record_request(endpoint, outcome)
    return response


async def _faulty(
    request: web.Request, handler: Handler, state: EmulatorState, endpoint: str
) -> web.StreamResponse:
    faults = state.faults
    if faults.down == "reset":
        return drop_connection(request, reset=True)
    if faults.down:
        raise detail(503, _ERROR_DETAILS[503])
    delay = faults.latency_seconds(endpoint, state.rng)
    if delay:
        await _injected_latency(state, endpoint, delay)
        faults = state.faults  # may have been replaced meanwhile
    _authenticate(request)
    limit = faults.rate_limited(endpoint, state.rng)
    if limit is not None:
        unit = "second" if limit.retry_after == 1 else "seconds"
        raise detail(
            429,
            f"Request was throttled. Expected available in {limit.retry_after} {unit}.",
            {"Retry-After": str(limit.retry_after)},
        )
    status = faults.injected_status(endpoint, state.rng)
    if status is not None:
        raise detail(status, _ERROR_DETAILS.get(status, f"Emulated error (HTTP {status})."))
    return await handler(request)


async def _injected_latency(state: EmulatorState, endpoint: str, seconds: float) -> None:
    """Sleep `seconds`, ending early once the fault set no longer delays this endpoint (so
    clearing faults releases requests held by a long latency)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (remaining := deadline - loop.time()) > 0:
        try:
            await asyncio.wait_for(state.faults_changed.wait(), remaining)
        except TimeoutError:
            return
        if not state.faults.delays(endpoint):
            return


def _authenticate(request: web.Request) -> None:
    token = request.app.get(TOKEN)
    if token is None:
        return
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    challenge = {"WWW-Authenticate": 'Bearer realm="api"'}
    if scheme.lower() != "bearer":
        raise detail(401, NOT_PROVIDED, challenge)
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise detail(401, INVALID_TOKEN, challenge)


# ---- servers -------------------------------------------------------------------------------


def tag_filters(request: web.Request) -> list[TagFilter]:
    """`tag:<key>=<value>` query parameters; an empty value matches any value of the key."""
    return [(key[4:], value) for key, value in request.query.items() if key.startswith("tag:")]


async def list_servers(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return json_bytes(state.render_list(state.matching(tag_filters(request))))


def _server(request: web.Request) -> ServerRecord:
    record = request.app[STATE].servers.get(request.match_info["uuid"])
    if record is None:
        raise detail(404, NOT_FOUND)
    return record


async def get_server(request: web.Request) -> web.Response:
    return json_bytes(request.app[STATE].render(_server(request)))


async def create_server(request: web.Request) -> web.Response:
    state = request.app[STATE]
    new = validate_create(await read_json(request), state)
    _refuse_create(state, new)
    record = state.create(new)
    lost = _lose_response(request, state, "create_server")
    if lost is not None:
        return lost
    # The real API answers before the server has booted.
    return json_bytes(state.render(record, "changing"), 201)


def _lose_response(
    request: web.Request, state: EmulatorState, endpoint: str
) -> web.Response | None:
    """The lose_create_responses fault, after a create (of `endpoint`) was carried out."""
    lost = state.faults.lose_create_responses
    mode = lost.take() if lost is not None and lost.endpoint == endpoint else None
    if mode == "drop":
        return drop_connection(request, reset=False)
    if mode == "504":
        return web.Response(status=504, body=_GATEWAY_TIMEOUT_HTML, content_type="text/html")
    return None


def _refuse_create(state: EmulatorState, new: NewServer) -> None:
    """Injected create failures, checked after validation like the real API would."""
    faults = state.faults
    failing = faults.fail_next_creates
    kind = failing.take() if failing else None
    if kind == "quota":
        raise detail(400, "Quota exceeded: emulated failure (fail_next_creates).")
    if kind == "capacity" or new.zone in faults.zones_out_of_capacity:
        raise detail(400, capacity_message(new.zone, new.flavor))
    shortage = faults.host_shortage
    if new.server_groups and shortage is not None and shortage.take(new.zone):
        raise detail(400, host_shortage_message(new.zone, new.server_groups[0].uuid))
    if kind == "server_error":
        raise detail(500, _ERROR_DETAILS[500])
    if kind == "invalid":
        raise ApiError(400, {"name": ["Emulated invalid request (fail_next_creates)."]})
    problem = quota_problem(state, new.flavor)
    if problem:
        raise detail(400, f"Quota exceeded: {problem}")


def capacity_message(zone: str, flavor: FlavorSpec) -> str:
    return f"Insufficient capacity in zone {zone} for flavor {flavor.slug}."


def host_shortage_message(zone: str, group_uuid: str) -> str:
    """No host can take one more member of the group (the client recognises "host" in a
    message about a server group, see docs/emulator.md)."""
    return (
        f"No distinct host available in zone {zone} for server group {group_uuid}: every host "
        "with room already runs one of its servers."
    )


def quota_problem(state: EmulatorState, flavor: FlavorSpec) -> str | None:
    quota = state.faults.quota
    if quota is None:
        return None
    servers = len(state.servers)
    if quota.max_servers is not None and servers + 1 > quota.max_servers:
        return f"servers (limit {quota.max_servers}, in use {servers})."
    if quota.max_vcpus is not None:
        in_use = state.vcpus_in_use()
        if in_use + flavor.vcpu_count > quota.max_vcpus:
            return (
                f"vCPUs (limit {quota.max_vcpus}, in use {in_use}, requested {flavor.vcpu_count})."
            )
    return None


async def delete_server(request: web.Request) -> web.Response:
    state = request.app[STATE]
    failing = state.faults.fail_next_deletes
    if failing is not None and request.match_info["uuid"] in state.servers:
        status = failing.take()
        if status is not None:
            raise detail(status, _ERROR_DETAILS.get(status, f"Emulated error (HTTP {status})."))
    linger = state.faults.slow_deletes_seconds
    if not state.delete(request.match_info["uuid"], "api", linger):
        raise detail(404, NOT_FOUND)
    return no_content()


async def patch_server(request: web.Request) -> web.Response:
    state = request.app[STATE]
    record = _server(request)
    patch = validate_patch(await read_json(request))
    if patch.tags is not None:
        state.set_tags(record, patch.tags)
    if patch.name is not None:
        state.rename(record, patch.name)
    return no_content()


# ---- server groups -------------------------------------------------------------------------


async def list_server_groups(request: web.Request) -> web.Response:
    state = request.app[STATE]
    groups = state.matching_groups(tag_filters(request))
    return json_value([state.render_group(group) for group in groups])


def _server_group(request: web.Request) -> ServerGroupRecord:
    group = request.app[STATE].server_group(request.match_info["uuid"])
    if group is None:
        raise detail(404, NOT_FOUND)
    return group


async def create_server_group(request: web.Request) -> web.Response:
    state = request.app[STATE]
    group = state.create_group(validate_server_group_create(await read_json(request)))
    lost = _lose_response(request, state, "create_server_group")
    if lost is not None:
        return lost
    return json_value(state.render_group(group), 201)


async def get_server_group(request: web.Request) -> web.Response:
    return json_value(request.app[STATE].render_group(_server_group(request)))


async def patch_server_group(request: web.Request) -> web.Response:
    state = request.app[STATE]
    group = _server_group(request)
    patch = validate_server_group_patch(await read_json(request))
    if patch.tags is not None:
        group.tags = dict(patch.tags)
    if patch.name is not None:
        state.rename_group(group, patch.name)
    return no_content()


async def delete_server_group(request: web.Request) -> web.Response:
    ident = request.match_info["uuid"]
    members = request.app[STATE].delete_group(ident)
    if members is None:
        raise detail(404, NOT_FOUND)
    if members:
        raise detail(400, non_empty_group_message(ident, members))
    return no_content()


def non_empty_group_message(ident: str, members: int) -> str:
    servers = "server" if members == 1 else "servers"
    return f"Cannot delete server group {ident}: it still has {members} {servers}."


# ---- catalogue -----------------------------------------------------------------------------


async def list_flavors(request: web.Request) -> web.Response:
    changes = request.app[STATE].flavor_changes
    if not changes:
        return json_bytes(_CATALOGUE["flavors"])
    return json_value([{**f.to_json(), **changes.get(f.slug, {})} for f in FLAVORS.values()])


async def list_images(request: web.Request) -> web.Response:
    return json_bytes(_CATALOGUE["images"])


async def list_regions(request: web.Request) -> web.Response:
    return json_bytes(_CATALOGUE["regions"])


async def list_networks(request: web.Request) -> web.Response:
    return json_value(networks_json(request.app[STATE].base))


async def list_subnets(request: web.Request) -> web.Response:
    return json_value(subnets_json(request.app[STATE].base))
