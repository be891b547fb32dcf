"""The top-level `pricing:` section: what CA's price expander is told a node costs.

Prices are decimals (a YAML number or a string such as "0.0913"), read into Decimal so that
no float rounding ever enters the arithmetic. Nothing is built in: cloudscale.ch changes its
prices, so the operator copies them from the price list.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from cloudscale_autoscaler.config.reader import Fields, child, describe, is_number, item
from cloudscale_autoscaler.settings.types import NodeGroupConfig, PricingConfig, with_entries

PRICING_KEYS = ("currency", "flavorsPerHour", "volumePerGBHour")
CURRENCY = r"[A-Z]{3}"  # ISO 4217
_CURRENCY = re.compile(CURRENCY)
# Far above any real price per hour in any currency, far enough below a double's range that
# a price times any interval CA can send (int64 seconds) stays a finite answer.
MAX_PRICE = Decimal(10**6)


def parse_price(value: Any) -> Decimal | str:
    """A non-negative decimal, or the reason it is not one."""
    if isinstance(value, str):
        try:
            price = Decimal(value.strip())
        except InvalidOperation:
            return f'invalid price "{value}": expected a decimal number such as 0.0913'
    elif is_number(value):
        # repr is the shortest text that reads back as the same float: 0.0913, not 0.09129...
        price = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    else:
        return f"expected a price (a number such as 0.0913), got {describe(value)}"
    if not price.is_finite():
        return f'invalid price "{value}": must be a finite number'
    if price < 0:
        return f"must not be negative, got {value}"
    if price > MAX_PRICE:
        return f"must be at most {MAX_PRICE}, got {value}"
    return price


def parse_pricing(top: Fields) -> PricingConfig | None:
    if not top.present("pricing"):
        return None
    fields = top.section("pricing", PRICING_KEYS)
    currency = fields.string("currency", required=True)
    if currency is not None and not _CURRENCY.fullmatch(currency):
        fields.issues.add(
            fields.at("currency"),
            f'invalid currency "{currency}": expected an ISO 4217 code such as CHF',
        )
    flavors: list[tuple[str, Decimal]] = []
    prices = fields.mapping("flavorsPerHour")
    if prices is None and fields.valid and not fields.present("flavorsPerHour"):
        fields.issues.add(fields.at("flavorsPerHour"), "required: a price per hour per flavor")
    for slug, raw in (prices or {}).items():
        path = child(fields.at("flavorsPerHour"), str(slug))
        if not isinstance(slug, str) or not slug:
            fields.issues.add(
                fields.at("flavorsPerHour"), f"keys must be flavor slugs, got {describe(slug)}"
            )
            continue
        price = parse_price(raw)
        if isinstance(price, str):
            fields.issues.add(path, price)
        else:
            flavors.append((slug, price))
    volume = Decimal(0)
    if fields.present("volumePerGBHour"):
        parsed = parse_price(fields.raw("volumePerGBHour"))
        if isinstance(parsed, str):
            fields.issues.add(fields.at("volumePerGBHour"), parsed)
        else:
            volume = parsed
    elif fields.valid:
        fields.issues.add(
            fields.at("volumePerGBHour"),
            "required: the price per GB of volume per hour (0 if free)",
        )
    return PricingConfig(currency=currency or "", flavors=tuple(sorted(flavors)), volume_gb=volume)


def check_group_prices(
    top: Fields, pricing: PricingConfig | None, groups: Sequence[NodeGroupConfig]
) -> None:
    """Every group's flavor needs a price: CA's price expander silently skips a group whose
    price is an error, so a missing price would mean that group is never chosen."""
    section = top.raw("pricing")
    given = section.get("flavorsPerHour") if isinstance(section, dict) else None
    if pricing is None or not isinstance(given, dict):
        return  # no pricing, or a section already reported as malformed
    for index, group in with_entries(tuple(groups)):
        if group.flavor and group.flavor not in given:
            top.issues.add(
                child("pricing.flavorsPerHour", group.flavor),
                f'no price for flavor "{group.flavor}" of {item("nodeGroups", index)} '
                f'("{group.name}"): CA\'s price expander would never choose that group',
            )


def pricing_text(pricing: PricingConfig | None) -> str:
    if pricing is None:
        return "none (the pricing RPCs answer UNIMPLEMENTED)"
    return (
        f"{pricing.currency}, {len(pricing.flavors)} flavor price(s), "
        f"volume {pricing.volume_gb} per GB and hour"
    )


def price_text(pricing: PricingConfig, group: NodeGroupConfig) -> str:
    """`0.1213 CHF/h (flavor 0.0913 + 50 GB x 0.0006)`."""
    hourly = pricing.node_hourly(group.flavor, group.volume_size_gb)
    return (
        f"{hourly} {pricing.currency}/h (flavor {pricing.flavor(group.flavor)} + "
        f"{group.volume_size_gb} GB x {pricing.volume_gb})"
    )
