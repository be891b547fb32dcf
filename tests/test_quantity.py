"""Kubernetes quantity grammar and canonical form.

Every expected string below was checked against Go's k8s.io/apimachinery v0.34.1
resource.Quantity (ParseQuantity, then String() of the recomputed value) when the table was
written; the comments say which Go rule each row exercises.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloudscale_autoscaler.template.quantity import (
    QuantityFormat,
    canonical,
    format_quantity,
    parse_percent,
    parse_quantity,
    parse_quantity_format,
)

Ki, Mi, Gi, Ti, Pi, Ei = (1024**n for n in range(1, 7))


@pytest.mark.parametrize(
    ("text", "value", "fmt"),
    [
        ("0", Fraction(0), "DecimalSI"),
        ("2", Fraction(2), "DecimalSI"),
        ("+2", Fraction(2), "DecimalSI"),
        ("-2", Fraction(-2), "DecimalSI"),
        ("007", Fraction(7), "DecimalSI"),
        ("500m", Fraction(1, 2), "DecimalSI"),
        ("1.5", Fraction(3, 2), "DecimalSI"),
        (".5", Fraction(1, 2), "DecimalSI"),
        ("5.", Fraction(5), "DecimalSI"),
        ("1.G", Fraction(10**9), "DecimalSI"),
        ("3n", Fraction(3, 10**9), "DecimalSI"),
        ("7u", Fraction(7, 10**6), "DecimalSI"),
        ("2k", Fraction(2000), "DecimalSI"),
        ("2M", Fraction(2 * 10**6), "DecimalSI"),
        ("2G", Fraction(2 * 10**9), "DecimalSI"),
        ("2T", Fraction(2 * 10**12), "DecimalSI"),
        ("2P", Fraction(2 * 10**15), "DecimalSI"),
        ("2E", Fraction(2 * 10**18), "DecimalSI"),  # a bare E is exa, not an exponent
        ("512Mi", Fraction(512 * Mi), "BinarySI"),
        ("1Ki", Fraction(Ki), "BinarySI"),
        ("1.5Gi", Fraction(3 * Gi, 2), "BinarySI"),
        ("3Ti", Fraction(3 * Ti), "BinarySI"),
        ("3Pi", Fraction(3 * Pi), "BinarySI"),
        ("3Ei", Fraction(3 * Ei), "BinarySI"),
        ("0.5Ki", Fraction(512), "BinarySI"),
        ("1e3", Fraction(1000), "DecimalExponent"),
        ("1E3", Fraction(1000), "DecimalExponent"),
        ("1e+3", Fraction(1000), "DecimalExponent"),
        ("12e-3", Fraction(12, 1000), "DecimalExponent"),
        # Go rounds the magnitude UP to a whole nano at parse time.
        ("1.5n", Fraction(2, 10**9), "DecimalSI"),
        ("0.1n", Fraction(1, 10**9), "DecimalSI"),
        ("-0.1n", Fraction(-1, 10**9), "DecimalSI"),
        ("1e-20", Fraction(1, 10**9), "DecimalExponent"),
        # A binary amount below one becomes decimal.
        ("0.0001Ki", Fraction(1024, 10**4), "DecimalSI"),
        # Binary amounts are capped at 2^63-1 in magnitude; decimal ones are not.
        ("10Ei", Fraction(2**63 - 1), "BinarySI"),
        ("-10Ei", Fraction(-(2**63 - 1)), "BinarySI"),
        ("1000E", Fraction(10**21), "DecimalSI"),
    ],
)
def test_parse(text: str, value: Fraction, fmt: QuantityFormat) -> None:
    assert parse_quantity_format(text) == (value, fmt)
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", "0"),
        ("-0", "0"),
        ("0Mi", "0"),
        ("1", "1"),
        ("+1", "1"),
        ("01", "1"),
        ("1.0", "1"),
        ("1.5", "1500m"),  # fractional digits become a smaller suffix
        ("0.5", "500m"),
        ("-0.5", "-500m"),
        ("1000m", "1"),  # the largest suffix that loses nothing
        ("1001m", "1001m"),
        ("7950m", "7950m"),
        ("0.1m", "100u"),
        ("1.5n", "2n"),
        ("1e-20", "1e-9"),
        ("10", "10"),
        ("100", "100"),
        ("110", "110"),
        ("1000", "1k"),
        ("1500k", "1500k"),
        ("1500000", "1500k"),
        ("12e6", "12e6"),
        ("1.5e3", "1500"),  # exponents are multiples of three
        ("1e1", "10"),
        ("1e2", "100"),
        ("1e-1", "100e-3"),
        ("5E-2", "50e-3"),
        ("1e99", "1e99"),
        ("1E", "1E"),
        ("1e18", "1e18"),
        ("1024", "1024"),  # decimal input stays decimal
        ("1Ki", "1Ki"),
        ("1024Ki", "1Mi"),
        ("1025Ki", "1025Ki"),
        ("1.5Gi", "1536Mi"),
        ("1.5Ki", "1536"),  # 1536 is not a multiple of 1024: no binary suffix
        ("0.5Ki", "512"),  # below 1024 a binary amount prints as decimal
        ("1.1Ki", "1126400m"),  # 1126.4 is not whole: decimal, milli
        ("15900Mi", "15900Mi"),
        ("16Gi", "16Gi"),
        ("100Gi", "100Gi"),
        ("4096Pi", "4Ei"),
        ("8Ei", "9223372036854775807"),  # 2^63 is capped to 2^63-1
        ("7Ei", "7Ei"),
        ("10Ei", "9223372036854775807"),  # capped at 2^63-1, odd: no suffix fits
        ("-1.5Gi", "-1536Mi"),
        ("1.000000001Ki", "1024000001024n"),
    ],
)
def test_canonical(text: str, expected: str) -> None:
    assert canonical(text) == expected


@pytest.mark.parametrize(
    ("value", "fmt", "expected"),
    [
        (Fraction(0), "BinarySI", "0"),
        (Fraction(8), "DecimalSI", "8"),
        (Fraction(7950, 1000), "DecimalSI", "7950m"),
        (Fraction(16 * Gi - 484 * Mi), "BinarySI", "15900Mi"),
        (Fraction(100 * Gi - 256 * Mi - 10 * Gi), "BinarySI", "91904Mi"),
        (Fraction(90 * Gi), "BinarySI", "90Gi"),
        (Fraction(1023), "BinarySI", "1023"),
        (Fraction(1024), "BinarySI", "1Ki"),
        (Fraction(1024), "DecimalSI", "1024"),
        (Fraction(1024), "DecimalExponent", "1024"),
        (Fraction(2048, 1000), "BinarySI", "2048m"),
        (Fraction(2049, 2), "BinarySI", "1024500m"),  # not whole: falls back to decimal
        (Fraction(-2048), "BinarySI", "-2Ki"),
        (Fraction(-1023), "BinarySI", "-1023"),
        (Fraction(96368328544), "BinarySI", "96368328544"),
        (Fraction(110), "DecimalSI", "110"),
        (Fraction(1, 3), "DecimalSI", "333333334n"),  # rounded up to a whole nano
        (Fraction(-1, 3), "DecimalSI", "-333333334n"),  # magnitude rounded up
        (Fraction(3 * 10**6), "DecimalExponent", "3e6"),
        (Fraction(3, 1000), "DecimalExponent", "3e-3"),
        (Fraction(10**21), "DecimalSI", "1000E"),  # Go would print "1": see the module doc
        (Fraction(8 * Ei * 1024), "BinarySI", "8192Ei"),  # Go: "8", see the module doc
        (7, "DecimalSI", "7"),
    ],
)
def test_format(value: Fraction, fmt: QuantityFormat, expected: str) -> None:
    assert format_quantity(value, fmt) == expected
    # Where the value is representable (whole nanos; binary amounts below Go's 2^63 cap),
    # the string means exactly the value.
    if (value * 10**9).denominator == 1 and abs(value) < 2**63:
        assert parse_quantity(expected) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "1 ",
        " 1",
        "1 Ki",
        "1e",
        "1e+",
        "1e3.5",
        "1K",
        "1ki",
        "1KI",
        "1mi",
        "1Mi3",
        "1Kib",
        "1.2.3",
        "+-1",
        "--1",
        "1_000",
        "0x10",
        "1,5",
        "\u0661",  # ARABIC-INDIC DIGIT ONE: not an ASCII digit
        "3.95 cores",
        "10%",
        # Deliberate deviations: Go's scanner accepts these (see the module docstring).
        ".",
        "-",
        "+",
        "Mi",
        "e3",
        "1e1001",
        "nan",
        "inf",
    ],
)
def test_invalid(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_quantity(text)
    assert str(info.value) == (
        f'invalid quantity "{text}": expected a Kubernetes quantity such as 500m, 512Mi or 2'
    )


def test_huge_digit_string_is_rejected_cleanly() -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity("9" * 10_000)


# Whole nanos below 2^63 in magnitude: what a quantity can hold in every format.
_NANOS = st.integers(min_value=-(2**63 - 1), max_value=2**63 - 1).flatmap(
    lambda whole: st.integers(0, 10**9 - 1).map(lambda nanos: whole + Fraction(nanos, 10**9))
)
_FORMATS = st.sampled_from(["BinarySI", "DecimalSI", "DecimalExponent"])


@given(value=_NANOS, fmt=_FORMATS)
def test_format_round_trips(value: Fraction, fmt: QuantityFormat) -> None:
    text = format_quantity(value, fmt)
    assert parse_quantity(text) == value
    assert format_quantity(parse_quantity(text), fmt) == text  # printing in one format is stable
    # Not canonical(text) == text: a BinarySI value with no factor of 1024 prints without a
    # suffix, and a quantity without a suffix reads back as DecimalSI ("327000" -> "327k").
    once = canonical(text)
    assert canonical(once) == once  # canonical form is a fixed point


@pytest.mark.parametrize(
    ("value", "printed", "reparsed"),
    [(327000, "327000", "327k"), (1023, "1023", "1023"), (2048, "2Ki", "2Ki")],
)
def test_binary_si_without_a_1024_factor(value: int, printed: str, reparsed: str) -> None:
    # apimachinery prints BinarySI 327000 as "327000", which parses as DecimalSI.
    assert format_quantity(Fraction(value), "BinarySI") == printed
    assert canonical(printed) == reparsed


_BINARY_MULTIPLES = st.integers(1, 6).flatmap(
    lambda power: st.integers(1, (2**63 - 1) // 1024**power).map(lambda n: (n, power))
)


@given(multiple=_BINARY_MULTIPLES)
def test_binary_multiples_keep_a_binary_suffix(multiple: tuple[int, int]) -> None:
    number, power = multiple
    text = format_quantity(Fraction(number * 1024**power), "BinarySI")
    assert text[-2:] in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
    assert parse_quantity(text) == number * 1024**power


@pytest.mark.parametrize(
    ("text", "percent"),
    [("10%", Fraction(10)), ("7.5%", Fraction(15, 2)), (".5%", Fraction(1, 2)), ("10.%", 10)],
)
def test_parse_percent(text: str, percent: Fraction) -> None:
    assert parse_percent(text) == percent


@pytest.mark.parametrize("text", ["\u0661\u0660%", "%", "10", "-1%", "1e2%", "10 %"])
def test_parse_percent_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid percentage"):
        parse_percent(text)
