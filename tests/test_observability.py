"""The alert rules and the Grafana dashboard against a real Prometheus (Debian's `prometheus`
package: the server and promtool).

- promtool checks deploy/prometheus/alerts.yaml and runs tests/observability/alerts_test.yaml,
  in which every alert fires on the series it is about and stays silent before its `for` and on
  look-alike series.
- The dashboard reads every query through its `datasource` variable, and its panels tile.
- A real Prometheus scrapes a real `serve` every second while a gRPC client drives it into a
  quota refusal through the emulator: every query of every dashboard panel returns data, and
  the data the panel is about (the refused create among the API errors, a placeholder among the
  placeholders); of the alert rules, which the server loads too, only the placeholders' is
  active.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from campaign.serve import start_serve, write_config
from cryptography import x509
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.tls import PKI, grpc_channel
from fixtures.tools import free_port

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERT_TESTS = Path(__file__).resolve().parent / "observability" / "alerts_test.yaml"
DASHBOARD = ROOT / "deploy" / "helm" / "cloudscale-autoscaler" / "files" / "dashboard.json"
# What Grafana puts in for $__rate_interval at a 1 s scrape interval is far shorter; a minute
# keeps every RPC of the scenario inside the window however slowly the machine runs it.
RATE_INTERVAL = "1m"
PROMETHEUS_START_SECONDS = 30.0
DATA_SECONDS = 60.0  # until every panel shows data: a few scrapes

Result = list[dict[str, Any]]  # an instant vector as the HTTP API answers it


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (apt-get install prometheus; .ci/run does)")
    return found


def alert_names() -> list[str]:
    (group,) = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule["alert"] for rule in group["rules"]]


# --- promtool ------------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [tool("promtool"), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in done.stdout


def test_every_alert_fires_and_stays_silent_in_promtool_tests() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))["tests"]
    cases = {
        (case["alertname"], bool(case["exp_alerts"]))
        for test in tests
        for case in test["alert_rule_test"]
    }
    wanted = {(alert, firing) for alert in alert_names() for firing in (True, False)}
    assert wanted - cases == set(), "each alert needs a firing and a silent case"
    done = subprocess.run(
        [tool("promtool"), "test", "rules", ALERT_TESTS.name],
        cwd=ALERT_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


# --- the dashboard as Grafana's provisioning reads it -----------------------------------


def test_dashboard_queries_the_datasource_variable_and_panels_do_not_overlap() -> None:
    """Provisioned into any Grafana: no data source uid of ours, every query through the
    `datasource` variable (a Prometheus one); ids unique; the panels tile a 24-column grid."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    via_variable = {"type": "prometheus", "uid": "${datasource}"}
    panels = dashboard["panels"]
    assert 8 <= len(panels) <= 12
    sources = [variables["job"]["datasource"]] + [
        source
        for panel in panels
        for source in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]
    ]
    assert [s for s in sources if s != via_variable] == []
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        taken = {
            (x, y)
            for x in range(box["x"], box["x"] + box["w"])
            for y in range(box["y"], box["y"] + box["h"])
        }
        assert not taken & cells, f"{panel['title']} overlaps another panel"
        cells |= taken


# --- a real Prometheus scraping a real serve ----------------------------------------------


def _write_prometheus_config(directory: Path, target: str) -> None:
    directory.mkdir()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "cloudscale-autoscaler", "static_configs": [{"targets": [target]}]}
        ],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))


@contextlib.asynccontextmanager
async def running_prometheus(directory: Path, target: str) -> AsyncIterator[str]:
    """Prometheus scraping `target` every second, with the alert rules; its base URL."""
    _write_prometheus_config(directory, target)
    address = f"127.0.0.1:{free_port()}"
    log = (directory / "prometheus.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        tool("prometheus"),
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address={address}",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://{address}"
    try:
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + PROMETHEUS_START_SECONDS
            while not await _ready(http, url):
                log.flush()
                output = (directory / "prometheus.log").read_text(errors="replace")
                assert process.returncode is None, f"prometheus exited:\n{output}"
                assert time.monotonic() < deadline, f"prometheus never got ready:\n{output}"
                await asyncio.sleep(0.2)
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()


async def _ready(http: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await http.get(f"{url}/-/ready")).status_code == 200
    except httpx.TransportError:
        return False


async def query(http: httpx.AsyncClient, url: str, expr: str) -> Result:
    answer = await http.get(f"{url}/api/v1/query", params={"query": expr})
    body = answer.json()
    assert answer.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    assert body["data"]["resultType"] == "vector", expr
    result: Result = body["data"]["result"]
    return result


def panel_queries(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Each panel's PromQL as Grafana sends it: every job (the variable's "All"), and
    $__rate_interval filled in."""
    (job,) = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
    return {
        panel["title"]: [
            target["expr"]
            .replace("$job", job["allValue"])
            .replace("$__rate_interval", RATE_INTERVAL)
            for target in panel["targets"]
        ]
        for panel in dashboard["panels"]
    }


def value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


def one(result: Result, **labels: str) -> float:
    """The value of the one series with these labels."""
    (sample,) = [s for s in result if labels.items() <= s["metric"].items()]
    return value(sample)


Check = Callable[[list[Result]], None]


def _placeholders(results: list[Result]) -> None:
    placeholders, creating = results
    assert one(placeholders, group="workers") >= 1, "the refused create left a placeholder"
    assert one(creating, group="workers") == 0


def _rpcs(results: list[Result]) -> None:
    (rpcs,) = results
    assert one(rpcs, method="NodeGroupIncreaseSize", code="OK") > 0
    assert one(rpcs, method="Refresh", code="OK") > 0


def _api_errors(results: list[Result]) -> None:
    (errors,) = results
    assert one(errors, operation="create_server", status="400") > 0, "the quota refusal"
    assert not [s for s in errors if s["metric"]["status"].startswith("2")]


def _sizes(results: list[Result]) -> None:
    target, servers, maximum = results
    assert one(target, group="workers") == 2, "the placeholders count"
    assert one(servers, group="workers") == 0
    assert one(maximum, group="workers") == 3


def _expect(check: Callable[[float], bool], **labels: str) -> Check:
    def checked(results: list[Result]) -> None:
        (result,) = results
        found = one(result, **labels)
        assert check(found), f"{found} for {labels}"

    return checked


def panel_checks(certificate_expiry: float) -> dict[str, Check]:
    """What each panel shows in the scenario (a quota refusal of one IncreaseSize)."""
    return {
        "Leading replicas": _expect(lambda v: v == 1),
        "Time since last successful Refresh": _expect(lambda v: 0 <= v < DATA_SECONDS + 30),
        "TLS certificate expires in": _expect(
            lambda v: abs(v - (certificate_expiry - time.time())) < 60
        ),
        "Placeholders and creations in flight": _placeholders,
        "RPCs by method and code": _rpcs,
        "RPC latency (99th percentile) by method": _expect(
            lambda v: 0 < v < 5, method="NodeGroupIncreaseSize"
        ),
        "Cloud API requests by operation and status": _expect(
            lambda v: v > 0, operation="list_servers", status="200"
        ),
        "Cloud API errors by operation and status": _api_errors,
        "Cloud API latency (99th percentile) by operation": _expect(
            lambda v: 0 < v < 10, operation="create_server"
        ),
        "Node group sizes": _sizes,
    }


async def drive(address: str, pki: PKI) -> None:
    """What CA does in a loop of the scenario: it refreshes, reads the groups, scales one up."""
    async with grpc_channel(pki, address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        await stub.Refresh(pb.RefreshRequest(), timeout=10)
        await stub.NodeGroups(pb.NodeGroupsRequest(), timeout=10)
        await stub.NodeGroupIncreaseSize(
            pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1), timeout=10
        )
        await stub.Refresh(pb.RefreshRequest(), timeout=10)


async def scraped(http: httpx.AsyncClient, url: str, expr: str) -> None:
    deadline = time.monotonic() + DATA_SECONDS
    while not await query(http, url, expr):
        assert time.monotonic() < deadline, f"{expr} never scraped"
        await asyncio.sleep(0.5)


async def all_panels_show_data(
    http: httpx.AsyncClient, url: str, queries: dict[str, list[str]]
) -> dict[str, list[Result]]:
    """Every query's result once each has a finite value, or what they had at the limit."""
    deadline = time.monotonic() + DATA_SECONDS
    while True:
        results = {
            title: [await query(http, url, expr) for expr in exprs]
            for title, exprs in queries.items()
        }
        empty = [
            (title, expr)
            for title, exprs in queries.items()
            for expr, result in zip(exprs, results[title], strict=True)
            if not any(math.isfinite(value(s)) for s in result)
        ]
        if not empty or time.monotonic() > deadline:
            assert empty == [], "panel queries without data"
            return results
        await asyncio.sleep(1)


async def active_alerts(http: httpx.AsyncClient, url: str) -> set[tuple[str, str | None]]:
    """Pending or firing alerts (name, group), once a rule evaluation saw any."""
    deadline = time.monotonic() + 10
    while True:
        alerts = (await http.get(f"{url}/api/v1/alerts")).json()["data"]["alerts"]
        if alerts or time.monotonic() > deadline:
            return {(a["labels"]["alertname"], a["labels"].get("group")) for a in alerts}
        await asyncio.sleep(0.5)


async def test_every_dashboard_panel_shows_its_scenario_in_a_real_prometheus(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = panel_queries(dashboard)
    served = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    checks = panel_checks(served.not_valid_after_utc.timestamp())
    assert sorted(queries) == sorted(checks), "every panel has a scenario check, and only they"

    await emulator.admin.set_faults({"quota": {"max_servers": 0}})
    metrics = f"127.0.0.1:{free_port()}"
    config = write_config(tmp_path / "serve", pki, emulator.url, TOKEN, metrics={"listen": metrics})
    serve = await start_serve(config, log_level="info", metrics=True)
    try:
        async with (
            running_prometheus(tmp_path / "prometheus", metrics) as url,
            httpx.AsyncClient() as http,
        ):
            # Twice, a scrape between: a rate needs a series' second sample, and the per-RPC
            # and per-status series begin with their first call.
            await drive(serve.address, pki)
            for series in (
                'cloudscale_autoscaler_grpc_requests_total{method="NodeGroupIncreaseSize"}',
                'cloudscale_autoscaler_cloud_api_requests_total{operation="create_server"}',
            ):
                await scraped(http, url, series)
            await drive(serve.address, pki)
            results = await all_panels_show_data(http, url, queries)
            for title, check in checks.items():
                try:
                    check(results[title])
                except (AssertionError, ValueError) as failure:
                    raise AssertionError(f"panel {title!r}: {failure}\n{results[title]}") from None
            # The job variable's values, as Grafana's label_values() asks for them.
            jobs = await http.get(
                f"{url}/api/v1/label/job/values",
                params={"match[]": "cloudscale_autoscaler_build_info"},
            )
            assert jobs.json()["data"] == ["cloudscale-autoscaler"]
            assert await active_alerts(http, url) == {
                ("CloudscaleAutoscalerPlaceholders", "workers")
            }
    finally:
        await serve.stop()
