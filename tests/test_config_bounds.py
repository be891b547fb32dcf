"""No config input ends in a traceback: depth and size are bounded, values the rest of the
system cannot hold are refused with their path, `<<` merges work, and a property test feeds
arbitrary text, bytes and YAML to the loader (the only outcomes: a Config or a ConfigError)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudscale_autoscaler.config.groups import MAX_VOLUME_GB
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.config.yamlfile import MAX_DEPTH, MAX_DOCUMENT_BYTES
from cloudscale_autoscaler.settings.types import Config, ConfigError

ENV = {"CLOUDSCALE_API_TOKEN": "bounds-test-token-0123456789"}
GROUP = "- {name: workers, minSize: 0, maxSize: 3, flavor: flex-4-2, image: d}"
HEAD = "cluster: prod\ntls: {insecure: true}\n"
# Go's time.Duration holds 2^63-1 ns: 2562047h47m16.854775807s.
GO_MAX = "2562047h47m16.854775807s"
GO_OVER = "2562047h47m16.854775808s"


def load(directory: Path, text: str | bytes, files: dict[str, str] | None = None) -> Config:
    for name, content in (files or {}).items():
        (directory / name).write_text(content)
    path = directory / "config.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return load_config(path, env=ENV)


def errors(directory: Path, text: str, files: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(directory, text, files)
    return caught.value.errors


def config_text(group_extra: str = "", top: str = "") -> str:
    return f"{HEAD}{top}nodeGroups:\n  {GROUP[:-1]}{group_extra}}}\n"


# Every file a config names, as (where it is written, the error's path).
NAMED_FILES = {
    "tokenFile": (lambda f: config_text(top=f"cloudscale: {{tokenFile: {f}}}\n"), "cloudscale"),
    "userData": (lambda f: config_text(f", userData: {{file: {f}}}"), "nodeGroups[0].userData"),
    "kubelet": (lambda f: config_text(f", kubelet: {{configFile: {f}}}"), "nodeGroups[0].kubelet"),
}


@pytest.mark.parametrize("named", NAMED_FILES)
def test_an_oversized_named_file_is_refused_naming_it(tmp_path: Path, named: str) -> None:
    write, at = NAMED_FILES[named]
    big = tmp_path / "big"
    big.write_text("x" * (MAX_DOCUMENT_BYTES + 1))
    (error,) = errors(tmp_path, write(big))
    assert error.startswith(f"{at}.")
    assert error.endswith(f": cannot read {big}: larger than 1024 KiB")


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
@pytest.mark.parametrize("named", NAMED_FILES)
def test_a_named_file_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, named: str, special: str
) -> None:
    # /dev/zero never ends and a FIFO blocks the reader: neither may be read.
    path = Path(special) if special.startswith("/") else tmp_path / special
    if special == "fifo":
        os.mkfifo(path)
    write, at = NAMED_FILES[named]
    (error,) = errors(tmp_path, write(path))
    assert error.startswith(f"{at}.")
    assert error.endswith(f": cannot read {path}: not a regular file")


def test_a_tls_file_that_is_not_a_regular_file_is_named_so(tmp_path: Path) -> None:
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_text("checked when serving starts\n")
    tls = "tls: {cert: tls.crt, key: tls.key, clientCA: /dev/zero}\n"
    text = config_text().replace("tls: {insecure: true}\n", tls)
    assert errors(tmp_path, text) == ["tls.clientCA: not a regular file: /dev/zero"]


@pytest.mark.parametrize(
    "deep",
    [
        "[" * 500 + "]" * 500,  # 1 KB, the RecursionError of old
        "{a: " * 500 + "1" + "}" * 500,
        "".join(f"{'  ' * i}a{i}:\n" for i in range(200)) + "  " * 200 + "x",
        "cluster: &a [" + "[" * 40 + "]" * 40 + "]\n",
    ],
    ids=["flow-lists", "flow-maps", "block-maps", "under-a-key"],
)
def test_deep_nesting_is_refused_naming_the_file(tmp_path: Path, deep: str) -> None:
    (error,) = errors(tmp_path, deep)
    assert error.startswith(f"{tmp_path / 'config.yaml'}: invalid YAML at line ")
    assert f"nested deeper than {MAX_DEPTH} levels" in error


def test_deep_nesting_in_a_kubelet_file_names_that_file(tmp_path: Path) -> None:
    text = config_text(", kubelet: {configFile: kubelet.yaml}")
    (error,) = errors(tmp_path, text, {"kubelet.yaml": "[" * 500 + "]" * 500})
    assert error.startswith("nodeGroups[0].kubelet.configFile(kubelet.yaml): invalid YAML")
    assert "nested deeper" in error


def test_an_oversized_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    big = HEAD + "# " + "x" * MAX_DOCUMENT_BYTES + "\n"
    (error,) = errors(tmp_path, big)
    assert error == f"{tmp_path / 'config.yaml'}: larger than 1024 KiB: too large for a config file"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            config_text(top=f"placeholderExpiry: {GO_OVER}\n"),
            f'placeholderExpiry: invalid duration "{GO_OVER}": beyond the about 292 years',
        ),
        (
            config_text(top="increaseSizeWait: 9999999999h\n"),
            'increaseSizeWait: invalid duration "9999999999h": beyond',
        ),
        (
            config_text(", autoscalingOptions: {maxNodeProvisionTime: 3000000h}"),
            "nodeGroups[0].autoscalingOptions.maxNodeProvisionTime: invalid duration",
        ),
        (
            config_text(f", volumeSizeGB: {MAX_VOLUME_GB + 1}"),
            f"nodeGroups[0].volumeSizeGB: must be at most {MAX_VOLUME_GB}, got {MAX_VOLUME_GB + 1}",
        ),
        (
            config_text(", kubelet: {maxPods: 4294967296}"),
            "nodeGroups[0].kubelet.maxPods: must be at most 2147483647, got 4294967296",
        ),
        (
            config_text(top="placeholderExpiry: 1" + "0" * 5000 + "s\n"),
            "placeholderExpiry: invalid duration",
        ),
    ],
    ids=["duration", "hours", "option-duration", "volume", "max-pods", "5000-digits"],
)
def test_values_beyond_what_the_system_holds_are_refused_with_their_path(
    tmp_path: Path, text: str, expected: str
) -> None:
    (error,) = errors(tmp_path, text)
    assert error.startswith(expected), error


def test_the_largest_go_duration_and_volume_are_accepted(tmp_path: Path) -> None:
    text = config_text(f", volumeSizeGB: {MAX_VOLUME_GB}", top=f"placeholderExpiry: {GO_MAX}\n")
    config = load(tmp_path, text)
    assert config.node_groups[0].volume_size_gb == MAX_VOLUME_GB
    assert config.placeholder_expiry_seconds == pytest.approx(2**63 / 1e9)


def test_an_integer_of_thousands_of_digits_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    (error,) = errors(tmp_path, config_text(", volumeSizeGB: 1" + "0" * 5000))
    assert error.startswith(f"{tmp_path / 'config.yaml'}: invalid YAML: a value cannot be read")


MERGED = """\
cluster: prod
tls: {insecure: true}
nodeGroups:
  - &defaults
    name: small
    minSize: 0
    maxSize: 3
    flavor: flex-4-2
    image: debian-12
    labels: {tier: a}
  - <<: *defaults
    name: large
    flavor: flex-16-4
"""


def test_the_merge_key_merges_and_written_keys_win(tmp_path: Path) -> None:
    small, large = load(tmp_path, MERGED).node_groups
    assert (large.name, large.flavor) == ("large", "flex-16-4")
    assert (large.image, large.max_size, large.labels) == ("debian-12", 3, small.labels)


def test_duplicates_next_to_a_merge_key_are_still_refused(tmp_path: Path) -> None:
    text = MERGED + "    flavor: flex-8-4\n"
    (error,) = errors(tmp_path, text)
    assert 'duplicate key "flavor"' in error


# --- property: any input, a Config or a ConfigError -----------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["90s", "1h", "10Gi", "50%", "flex-4-2", "<<", "*a", "&a x", "!!binary"]),
)
_KEYS = st.sampled_from(
    ["cluster", "tls", "insecure", "cloudscale", "nodeGroups", "name", "minSize", "maxSize",
     "flavor", "image", "kubelet", "maxPods", "systemReserved", "evictionHard", "labels",
     "taints", "autoscalingOptions", "scaleDownUnneededTime", "placeholderExpiry",
     "volumeSizeGB", "userData", "tags", "metrics", "listen", "<<"]
) | st.text(max_size=8)  # fmt: skip
_DOCS = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=30,
)


# Pieces of YAML syntax, deep openings and long numbers, joined at random: deep nesting and
# unreadable scalars are what broke the loader before.
_SYNTAX = st.lists(
    st.one_of(
        st.sampled_from(["[", "]", "{", "}", ": ", ", ", "- ", "\n", "  ", "a", "<<: ", "*a",
                         "&a ", "!!set ", "!!binary ", "? ", "'", '"', "#", "2001-02-30",
                         "cluster"]),
        st.integers(1, 1500).map(lambda n: "[" * n),
        st.integers(1, 600).map(lambda n: "{a: " * n),
        st.integers(1, 6000).map(lambda n: "9" * n),
        st.text(max_size=10),
    ),
    max_size=12,
).map("".join)  # fmt: skip


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


def outcome(directory: Path, text: str | bytes) -> None:
    try:
        config = load(directory, text)
    except ConfigError as error:
        assert error.errors and all(isinstance(e, str) and e for e in error.errors)
    else:
        assert isinstance(config, Config)


_PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(
    "inputs",
    [st.text(max_size=300), _SYNTAX, st.binary(max_size=300)],
    ids=["text", "yaml-syntax", "bytes"],
)
def test_any_file_gives_a_config_or_a_config_error(
    scratch: Path, inputs: st.SearchStrategy[str | bytes]
) -> None:
    @_PROPERTY
    @given(raw=inputs)
    def check(raw: str | bytes) -> None:
        outcome(scratch, raw)

    check()


@_PROPERTY
@given(doc=_DOCS)
def test_any_yaml_document_gives_a_config_or_a_config_error(scratch: Path, doc: Any) -> None:
    outcome(scratch, yaml.safe_dump(doc))


@_PROPERTY
@given(groups=st.lists(st.dictionaries(_KEYS, _DOCS, max_size=6), max_size=3), top=_DOCS)
def test_any_near_valid_config_gives_a_config_or_a_config_error(
    scratch: Path, groups: list[dict[str, Any]], top: Any
) -> None:
    doc: dict[str, Any] = {"cluster": "prod", "tls": {"insecure": True}, "nodeGroups": groups}
    if isinstance(top, dict):
        doc.update(top)
    outcome(scratch, yaml.safe_dump(doc))
