"""Plain scalars mean what the YAML 1.2 core schema says (as in Go's YAML libraries), not
PyYAML's YAML 1.1: `yes`/`on` are strings, `1:30` is no sexagesimal 90, hexadecimal and octal
are not numbers; where the config expects a number or a boolean, these are errors with the
path. NaN and infinity are numbers, but never a valid setting."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.config.yamlfile import YamlProblem, parse_yaml
from cloudscale_autoscaler.settings.types import Config, ConfigError

ENV = {"CLOUDSCALE_API_TOKEN": "yaml12-test-token-0123456789"}
GROUP = "{name: workers, minSize: 0, maxSize: 3, flavor: flex-4-2, image: d"


def config_text(group_extra: str = "", top: str = "") -> str:
    return f"cluster: prod\ntls: {{insecure: true}}\n{top}nodeGroups:\n  - {GROUP}{group_extra}}}\n"


def load(directory: Path, text: str) -> Config:
    path = directory / "config.yaml"
    path.write_text(text)
    return load_config(path, env=ENV)


def errors(directory: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(directory, text)
    return caught.value.errors


@pytest.mark.parametrize(
    ("scalar", "value"),
    [
        # YAML 1.1 booleans are strings; only the core schema's six spellings are booleans.
        ("yes", "yes"),
        ("No", "No"),
        ("on", "on"),
        ("OFF", "OFF"),
        ("y", "y"),
        ("true", True),
        ("False", False),
        ("TRUE", True),
        # Sexagesimal, hexadecimal, octal, binary, leading zero, underscores: strings.
        ("1:30", "1:30"),
        ("190:20:30.15", "190:20:30.15"),
        ("0x10", "0x10"),
        ("0o17", "0o17"),
        ("010", "010"),
        ("0b101", "0b101"),
        ("1_000", "1_000"),
        # Decimal integers and floats as the core schema has them.
        ("0", 0),
        ("-12", -12),
        ("+7", 7),
        ("1.5", 1.5),
        ("-.5", -0.5),
        ("1e3", 1000.0),
        ("2.5E-1", 0.25),
        ("1.", 1.0),
        (".inf", math.inf),
        ("-.Inf", -math.inf),
        # Nulls, dates (strings in 1.2), and the 1.1 value key `=`.
        ("~", None),
        ("null", None),
        ("NULL", None),
        ("", None),
        ("2024-01-31", "2024-01-31"),
        ("=", "="),
        ("nulls", "nulls"),
        ("truely", "truely"),
    ],
)
def test_plain_scalars_have_their_core_schema_meaning(scalar: str, value: Any) -> None:
    assert parse_yaml(f"k: {scalar}\n") == {"k": value}
    assert type(parse_yaml(f"k: {scalar}\n")["k"]) is type(value)


def test_nan_is_a_float_nan() -> None:
    assert math.isnan(parse_yaml("k: .NaN\n")["k"])


@pytest.mark.parametrize("literal", ["1e400", "-2.5e309"])
def test_a_number_beyond_a_double_is_refused_with_its_line(literal: str) -> None:
    with pytest.raises(YamlProblem) as caught:
        parse_yaml(f"a: 1\nk: {literal}\n")
    assert str(caught.value) == (
        f"invalid YAML at line 2, column 4: {literal} is beyond the range of a number "
        "(about 1.8e308)"
    )


@pytest.mark.parametrize(
    ("tagged", "reason"),
    [
        ("!!int 1:30", '"1:30" is not a YAML 1.2 decimal integer'),
        ("!!int 0x10", '"0x10" is not a YAML 1.2 decimal integer'),
        ("!!bool yes", '"yes" is not a YAML 1.2 boolean (true or false)'),
        ("!!float 1_0.5", '"1_0.5" is not a YAML 1.2 number'),
    ],
)
def test_an_explicit_tag_does_not_bring_back_the_yaml_11_forms(tagged: str, reason: str) -> None:
    with pytest.raises(YamlProblem) as caught:
        parse_yaml(f"k: {tagged}\n")
    assert str(caught.value) == f"invalid YAML at line 1, column 4: {reason}"


@pytest.mark.parametrize(
    ("tagged", "value"), [("!!int 12", 12), ("!!bool false", False), ("!!float 7", 7.0)]
)
def test_an_explicit_tag_reads_the_core_forms(tagged: str, value: Any) -> None:
    assert parse_yaml(f"k: {tagged}\n") == {"k": value}


def test_keys_are_read_with_the_same_schema() -> None:
    assert parse_yaml("on: 1\nyes: 2\n0x1: 3\n1: 4\n") == {"on": 1, "yes": 2, "0x1": 3, 1: 4}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            config_text().replace("maxSize: 3", "maxSize: 1:30"),
            'expected an integer, got string "1:30"',
        ),
        (
            config_text().replace("maxSize: 3", "maxSize: 0x10"),
            'expected an integer, got string "0x10"',
        ),
        (
            config_text().replace("maxSize: 3", "maxSize: 0o17"),
            'expected an integer, got string "0o17"',
        ),
        (
            config_text().replace("maxSize: 3", "maxSize: 010"),
            'expected an integer, got string "010"',
        ),
        (
            config_text().replace("maxSize: 3", "maxSize: 1e1"),
            "expected an integer, got number 10.0",
        ),
        (
            config_text().replace("maxSize: 3", "maxSize: .inf"),
            "expected an integer, got number .inf",
        ),
    ],
    ids=["sexagesimal", "hexadecimal", "octal", "leading-zero", "exponent", "infinity"],
)
def test_a_yaml_11_number_is_refused_where_an_integer_is_expected(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert errors(tmp_path, text) == [f"nodeGroups[0].maxSize: {expected}"]


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "Yes", "OFF", "y"])
def test_a_yaml_11_boolean_is_refused_where_a_boolean_is_expected(
    tmp_path: Path, word: str
) -> None:
    text = config_text(f", useIPv6: {word}, autoscalingOptions: {{zeroOrMaxNodeScaling: {word}}}")
    assert errors(tmp_path, text) == [
        f'nodeGroups[0].useIPv6: expected true or false, got string "{word}"',
        "nodeGroups[0].autoscalingOptions.zeroOrMaxNodeScaling: "
        f'expected true or false, got string "{word}"',
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            config_text(top="cloudscale: {timeoutSeconds: .nan}\n"),
            "cloudscale.timeoutSeconds: expected a finite number, got number .nan",
        ),
        (
            config_text(top="cloudscale: {timeoutSeconds: .inf}\n"),
            "cloudscale.timeoutSeconds: expected a finite number, got number .inf",
        ),
        (
            config_text(top="cloudscale: {requestsPerSecond: -.INF}\n"),
            "cloudscale.requestsPerSecond: expected a finite number, got number -.inf",
        ),
        (
            config_text(", autoscalingOptions: {scaleDownUtilizationThreshold: .NaN}"),
            "nodeGroups[0].autoscalingOptions.scaleDownUtilizationThreshold: "
            "expected a finite number, got number .nan",
        ),
        (
            config_text(top="cloudscale: {timeoutSeconds: 1:30}\n"),
            'cloudscale.timeoutSeconds: expected a number, got string "1:30"',
        ),
    ],
    ids=["nan", "inf", "minus-inf", "threshold-nan", "sexagesimal"],
)
def test_a_number_field_names_itself_and_asks_for_a_finite_number(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert errors(tmp_path, text) == [expected]


def test_yaml_11_words_are_plain_strings_where_strings_are_expected(tmp_path: Path) -> None:
    extra = ", labels: {a: on, b: yes, c: off, d: 2024-01-31}, tags: {n: no, t: 1:30}"
    text = config_text(extra, top="cloudscale: {timeoutSeconds: 1e1}\n")
    config = load(tmp_path, text)
    (group,) = config.node_groups
    assert dict(group.labels) == {"a": "on", "b": "yes", "c": "off", "d": "2024-01-31"}
    assert dict(group.tags) == {"n": "no", "t": "1:30"}
    assert config.cloudscale.timeout_seconds == 10.0
