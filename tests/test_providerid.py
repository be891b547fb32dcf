"""providerID parsing: every spelling CA may send, and everything that is not ours."""

from __future__ import annotations

import pytest

from cloudscale_autoscaler.engine.providerid import (
    canonical_uuid,
    format_provider_id,
    parse_placeholder_id,
    parse_server_uuid,
    placeholder_provider_id,
)

UUID = "47cec963-fcd2-482f-bdb6-24461b2d47b1"


@pytest.mark.parametrize(
    ("provider_id", "expected"),
    [
        (f"cloudscale://{UUID}", UUID),
        (f"cloudscale://{UUID.upper()}", UUID),
        (f"CloudScale://{UUID}", UUID),
        (f"cloudscale://{UUID.replace('-', '')}", UUID),
        (f"cloudscale://{UUID.replace('-', '').upper()}", UUID),
        ("", None),
        ("cloudscale://", None),
        (UUID, None),
        (f"aws://{UUID}", None),
        (f"cloudscale:/{UUID}", None),
        (f"cloudscale://{UUID}x", None),
        (f"cloudscale://{UUID[:-1]}", None),
        (f"cloudscale://{UUID[:-1]}g", None),
        ("cloudscale://47cec963fcd2-482f-bdb6-24461b2d47b1-", None),
        ("cloudscale://failed-0123456789abcdef", None),
        (f"cloudscale:// {UUID}", None),
    ],
)
def test_parse_server_uuid(provider_id: str, expected: str | None) -> None:
    assert parse_server_uuid(provider_id) == expected


@pytest.mark.parametrize(
    ("provider_id", "expected"),
    [
        ("cloudscale://failed-abc123", "abc123"),
        ("CLOUDSCALE://failed-abc123", "abc123"),
        ("cloudscale://failed-", None),
        ("cloudscale://FAILED-abc", None),
        (f"cloudscale://{UUID}", None),
        ("failed-abc", None),
        ("", None),
    ],
)
def test_parse_placeholder_id(provider_id: str, expected: str | None) -> None:
    assert parse_placeholder_id(provider_id) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (UUID, UUID),
        (UUID.upper(), UUID),
        (UUID.replace("-", ""), UUID),
        ("47cec963-fcd2-482f-bdb6_24461b2d47b1", None),
        ("47cec963-fcd2-482fbdb6-24461b2d47b1-", None),
        ("", None),
    ],
)
def test_canonical_uuid(text: str, expected: str | None) -> None:
    assert canonical_uuid(text) == expected


def test_format_round_trips() -> None:
    assert parse_server_uuid(format_provider_id(UUID)) == UUID
    assert format_provider_id(UUID) == f"cloudscale://{UUID}"
    assert parse_placeholder_id(placeholder_provider_id("0a1b")) == "0a1b"
