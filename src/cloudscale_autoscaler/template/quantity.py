"""Kubernetes resource quantities ("500m", "512Mi", "2", "1e3"): parse and canonical format.

Values are exact `Fraction`s, never floats: the kubelet arithmetic must come out to the same
strings Kubernetes itself would print (the Cluster Autoscaler parses them with Go's
k8s.io/apimachinery resource.Quantity, and a string it rejects breaks the whole template).

Semantics follow apimachinery's quantity.go:
- Parsing rounds the magnitude UP to a whole nano (10^-9): "1.5n" is 2n. Go does this so that a
  tiny non-zero request never becomes zero.
- BinarySI parses are capped at 2^63-1 in magnitude (decimal ones are not).
- Formatting is Go's canonical form (`Quantity.String()` of a computed value): the largest
  suffix that loses no precision and leaves no fractional digits. Decimal exponents are always
  multiples of 3. BinarySI is only used for whole numbers of magnitude >= 1024; anything else
  requested as BinarySI falls back to DecimalSI ("512", "1536", "500m", "1024500m").

Deliberate deviations from Go, for inputs this project never produces:
- Go's scanner also accepts strings without a number, such as ".", "-", "+" or a bare suffix
  ("Mi", "e3"), as zero; we follow the documented grammar and reject them.
- Exponents beyond +-1000 are rejected rather than materialised as huge numbers.
- Go prints a value whose canonical exponent has no suffix (above 10^18 "E", or 1024^6 "Ei") as
  the bare mantissa, which silently changes the value; we keep the largest suffix and a longer
  mantissa instead, so the string still means the value.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal

QuantityFormat = Literal["BinarySI", "DecimalSI", "DecimalExponent"]

_NANO = 10**9
_MAX_BINARY = 2**63 - 1
_MAX_EXPONENT = 1000

_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_POWER = {power: suffix for suffix, power in _BINARY_SUFFIXES.items()}
_BINARY_BY_POWER[0] = ""

# <signedNumber><suffix>; [0-9] rather than \d so that non-ASCII digits are rejected like Go does.
# The exponent alternative comes first so "1E3" is 1e3 while a bare "1E" is one exa.
_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)"
    r"(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<bin>[KMGTPE]i)|(?P<dec>[numkMGTPE]?))"
)


def _invalid(text: str) -> ValueError:
    return ValueError(
        f'invalid quantity "{text}": expected a Kubernetes quantity such as 500m, 512Mi or 2'
    )


def _round_up_to_nano(value: Fraction) -> Fraction:
    """Round the magnitude up to a whole nano, as Go's parser does (inf.RoundUp)."""
    scaled = value * _NANO
    if scaled.denominator == 1:
        return value
    magnitude = -(-abs(scaled.numerator) // scaled.denominator)  # ceiling of |scaled|
    return Fraction(magnitude if value > 0 else -magnitude, _NANO)


def parse_quantity_format(text: str) -> tuple[Fraction, QuantityFormat]:
    """Parse a quantity into its exact value and the format Go would remember for it."""
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise _invalid(text)
    digits, frac = match["int"], match["frac"] or ""
    if not digits and not frac:  # "", ".", "-", "Mi": no number at all
        raise _invalid(text)
    try:
        number = Fraction(int(digits + frac or "0"), 10 ** len(frac))
    except ValueError as exc:  # a digit string beyond Python's int conversion limit
        raise _invalid(text) from exc
    if match["sign"] == "-":
        number = -number

    fmt: QuantityFormat
    if match["exp"] is not None:
        exponent = int(match["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise _invalid(text)
        value, fmt = number * Fraction(10) ** exponent, "DecimalExponent"
    elif match["bin"] is not None:
        value, fmt = number * 1024 ** _BINARY_SUFFIXES[match["bin"]], "BinarySI"
    else:
        value, fmt = number * Fraction(10) ** _DECIMAL_SUFFIXES[match["dec"]], "DecimalSI"

    value = _round_up_to_nano(value)
    if fmt == "BinarySI":
        if abs(value) > _MAX_BINARY:
            value = Fraction(_MAX_BINARY if value > 0 else -_MAX_BINARY)
        if 0 < abs(value) < 1:
            fmt = "DecimalSI"  # Go switches here too: "0.5Ki" is not a binary amount
    return value, fmt


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity string; ValueError naming the text if invalid."""
    return parse_quantity_format(text)[0]


# Kubelet's eviction percentages ("10%", "7.5%"), in ASCII digits like quantities.
_PERCENT_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)%")


def parse_percent(text: str) -> Fraction:
    """The number of percent in "10%" (any size: the caller bounds it); ValueError if no
    percentage. The one grammar that config validation and the template both apply."""
    if not _PERCENT_RE.fullmatch(text):
        raise ValueError(
            f'invalid percentage "{text}": expected a number followed by %, such as 10%'
        )
    return Fraction(text[:-1])


def format_quantity(value: Fraction | int, fmt: QuantityFormat) -> str:
    """The canonical string Go's resource.Quantity.String() prints for this value and format."""
    value = _round_up_to_nano(Fraction(value))
    if value == 0:
        return "0"
    if fmt == "BinarySI" and abs(value) >= 1024 and value.denominator == 1:
        return _format_binary(value.numerator)
    if fmt not in ("BinarySI", "DecimalSI", "DecimalExponent"):
        fmt = "DecimalExponent"  # what Go does with an unknown format
    return _format_decimal(value, exponent_form=fmt == "DecimalExponent")


def _format_binary(number: int) -> str:
    power = 0
    while number % 1024 == 0 and power < max(_BINARY_BY_POWER):
        number //= 1024
        power += 1
    return f"{number}{_BINARY_BY_POWER[power]}"


def _format_decimal(value: Fraction, *, exponent_form: bool) -> str:
    # value is a whole number of nanos: mantissa * 10^exponent with no trailing zeros.
    mantissa, exponent = (value * _NANO).numerator, -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    # Lower the exponent to a multiple of 3 (Python's % floors, matching Go's two cases).
    shift = exponent % 3
    mantissa, exponent = mantissa * 10**shift, exponent - shift
    if exponent_form:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    if exponent > max(_DECIMAL_BY_EXPONENT):
        mantissa *= 10 ** (exponent - max(_DECIMAL_BY_EXPONENT))
        exponent = max(_DECIMAL_BY_EXPONENT)
    return f"{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"


def canonical(text: str) -> str:
    """Parse and re-print a quantity in canonical form ("1.5Gi" -> "1536Mi").

    Go's String() of a freshly parsed quantity sometimes echoes the input ("+1", "01"); this is
    the form Go prints once the value has been computed with, which is what kubelet reports.
    """
    return format_quantity(*parse_quantity_format(text))
