"""The admin API under /_emulator/: no auth, no faults, no statistics.

Tests use it to arrange the cloud (servers outside any cluster, thousands of servers for
benchmarks, server groups), to inject faults, and to check what happened (deletion log,
request counts).
"""

from __future__ import annotations

from aiohttp import web

from cloudscale_autoscaler.cloud.emulator import api
from cloudscale_autoscaler.cloud.emulator.api import STATE
from cloudscale_autoscaler.cloud.emulator.catalogue import FLAVORS, ZONES
from cloudscale_autoscaler.cloud.emulator.faults import Faults, parse_faults
from cloudscale_autoscaler.cloud.emulator.responses import (
    NOT_FOUND,
    detail,
    json_bytes,
    json_value,
    no_content,
    read_json,
)
from cloudscale_autoscaler.cloud.emulator.validation import (
    validate_create,
    validate_populate,
    validate_server_group_create,
)

PREFIX = "/_emulator"


def add_routes(app: web.Application) -> None:
    router = app.router
    router.add_get(f"{PREFIX}/servers", servers)
    router.add_post(f"{PREFIX}/servers", create_server)
    router.add_delete(f"{PREFIX}/servers/{{uuid}}", delete_server)
    router.add_get(f"{PREFIX}/server-groups", server_groups)
    router.add_post(f"{PREFIX}/server-groups", create_server_group)
    # The API's own handler (a group "deleted behind the provider's back"): unnamed here, so
    # faults and statistics, which follow route names, pass it by.
    router.add_delete(f"{PREFIX}/server-groups/{{uuid}}", api.delete_server_group)
    router.add_get(f"{PREFIX}/user-data", user_data)
    router.add_post(f"{PREFIX}/populate", populate)
    router.add_get(f"{PREFIX}/deletions", deletions)
    router.add_get(f"{PREFIX}/stats", stats)
    router.add_get(f"{PREFIX}/faults", get_faults)
    router.add_put(f"{PREFIX}/faults", put_faults)
    router.add_delete(f"{PREFIX}/faults", clear_faults)
    router.add_post(f"{PREFIX}/reset", reset)
    router.add_put(f"{PREFIX}/flavors/{{slug}}", change_flavor)


async def servers(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.purge()
    return json_bytes(state.render_list(state.servers.values()))


async def create_server(request: web.Request) -> web.Response:
    """Like POST /v1/servers, bypassing faults and quota; "status" pins the status."""
    state = request.app[STATE]
    new = validate_create(await read_json(request), state, allow_status=True)
    record = state.create(new)
    return json_bytes(state.render(record), 201)


async def delete_server(request: web.Request) -> web.Response:
    if not request.app[STATE].delete(request.match_info["uuid"], "admin"):
        raise detail(404, NOT_FOUND)
    return no_content()


async def server_groups(request: web.Request) -> web.Response:
    """Every server group as the API lists it (no filter, no faults, not counted)."""
    state = request.app[STATE]
    state.purge()
    return json_value([state.render_group(group) for group in state.server_groups.values()])


async def create_server_group(request: web.Request) -> web.Response:
    """Like POST /v1/server-groups, bypassing faults and statistics."""
    state = request.app[STATE]
    group = state.create_group(validate_server_group_create(await read_json(request)))
    return json_value(state.render_group(group), 201)


async def user_data(request: web.Request) -> web.Response:
    """Each server's user_data as its create request gave it (the API never shows it again):
    what a test's stand-in kubelet reads its --node-labels and --register-with-taints from."""
    state = request.app[STATE]
    state.purge()
    return json_value({record.uuid: record.user_data for record in state.servers.values()})


async def populate(request: web.Request) -> web.Response:
    state = request.app[STATE]
    count, template = validate_populate(await read_json(request), state)
    return json_value({"uuids": state.populate(count, template)}, 201)


async def deletions(request: web.Request) -> web.Response:
    return json_value(request.app[STATE].deletions)


async def stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    in_flight = {endpoint: n for endpoint, n in state.in_flight.items() if n}
    return json_value({"requests": state.stats, "in_flight": in_flight})


async def get_faults(request: web.Request) -> web.Response:
    return json_value(request.app[STATE].faults.to_json())


async def put_faults(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.set_faults(parse_faults(await read_json(request), ZONES))
    return json_value(state.faults.to_json())


async def clear_faults(request: web.Request) -> web.Response:
    request.app[STATE].set_faults(Faults())
    return no_content()


async def change_flavor(request: web.Request) -> web.Response:
    """The body's fields replace the flavor's in GET /v1/flavors from now on (until reset):
    the catalogue changed, or the API answers what it never should (1e999 is infinity)."""
    slug = request.match_info["slug"]
    if slug not in FLAVORS:
        raise detail(404, NOT_FOUND)
    fields = await read_json(request)
    if not isinstance(fields, dict):
        raise detail(400, "Expected a JSON object of flavor fields.")
    changes = request.app[STATE].flavor_changes
    changes[slug] = {**changes.get(slug, {}), **fields}
    return json_value(changes[slug])


async def reset(request: web.Request) -> web.Response:
    request.app[STATE].reset()
    return no_content()
