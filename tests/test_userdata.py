"""User-data rendering: placeholder substitution and kubelet flag syntax."""

from __future__ import annotations

import pytest

from cloudscale_autoscaler.settings.types import Taint
from cloudscale_autoscaler.template.userdata import (
    UserDataError,
    format_labels,
    format_taints,
    placeholders_in,
    render,
)

VALUES = {
    "node_labels": "role=worker,tier=a",
    "node_taints": "dedicated=gpu:NoSchedule",
    "server_name": "prod-workers-abcd1234",
    "group": "workers",
    "cluster": "prod",
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("", ""),
        ("no placeholders", "no placeholders"),
        ("${server_name}", "prod-workers-abcd1234"),
        ("--node-labels=${node_labels}", "--node-labels=role=worker,tier=a"),
        (
            "--register-with-taints=${node_taints}",
            "--register-with-taints=dedicated=gpu:NoSchedule",
        ),
        ("${cluster}/${group}", "prod/workers"),
        ("${group}${group}", "workersworkers"),
        ("$${group}", "${group}"),
        ("$${unknown}", "${unknown}"),
        ("$$${group}", "$${group}"),
        ("cost $5 and $HOME", "cost $5 and $HOME"),
        ("${ not closed? no: $ {group}", None),
        ("x ${group", None),
        ("${}", None),
        ("${foo-bar}", None),
        ("${unknown}", None),
        ("line1\n  ${server_name}\nline3", "line1\n  prod-workers-abcd1234\nline3"),
    ],
)
def test_render(template: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(UserDataError):
            render(template, VALUES)
    else:
        assert render(template, VALUES) == expected


def test_unknown_placeholder_error_names_it() -> None:
    with pytest.raises(UserDataError, match=r"\$\{nodes\}"):
        render("${nodes}", VALUES)


def test_values_are_not_rescanned() -> None:
    # A substituted value containing ${...} stays as it is: substitution is single-pass.
    assert render("${group}", {"group": "${cluster}"}) == "${cluster}"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("${a} $${b} ${c}", ["a", "c"]),
        ("nothing", []),
    ],
)
def test_placeholders_in(template: str, expected: list[str]) -> None:
    assert placeholders_in(template) == expected


def test_placeholders_in_rejects_malformed() -> None:
    with pytest.raises(UserDataError, match="offset 4"):
        placeholders_in("abc ${x")


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ((), ""),
        ((("role", "worker"),), "role=worker"),
        ((("role", "worker"), ("example.com/tier", "a")), "role=worker,example.com/tier=a"),
        ((("empty", ""),), "empty="),
    ],
)
def test_format_labels(labels: tuple[tuple[str, str], ...], expected: str) -> None:
    assert format_labels(labels) == expected


@pytest.mark.parametrize(
    ("taints", "expected"),
    [
        ((), ""),
        ((Taint("dedicated", "gpu", "NoSchedule"),), "dedicated=gpu:NoSchedule"),
        ((Taint("spot", "", "PreferNoSchedule"),), "spot:PreferNoSchedule"),
        (
            (Taint("a", "1", "NoExecute"), Taint("b", "", "NoSchedule")),
            "a=1:NoExecute,b:NoSchedule",
        ),
    ],
)
def test_format_taints(taints: tuple[Taint, ...], expected: str) -> None:
    assert format_taints(taints) == expected
