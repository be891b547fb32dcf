"""`zones` (one node group per zone, named `<name>-<zone>`) and `antiAffinity` in the config:
what they make, and each misuse refused with its path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.emulator import RunningEmulator
from test_check_config import EMULATOR_TOKEN, check_online, failure_lines
from test_check_config import write_config as write_checked_config
from test_config import ENV, base_doc, errors_of, write

from cloudscale_autoscaler.config.advice import config_warnings
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.template.labels import LABEL_POOL


def with_group(**fields: Any) -> dict[str, Any]:
    doc = base_doc()
    doc["nodeGroups"][0].update(fields)
    return doc


def test_zones_fan_a_group_out_into_one_group_per_zone(tmp_path: Path) -> None:
    doc = with_group(zones=["lpg1", "rma1"], minSize=1, maxSize=4, labels={"role": "web"},
                     antiAffinity=True)  # fmt: skip
    config = load_config(write(tmp_path, doc), env=ENV)
    assert [(g.name, g.zone, g.pool) for g in config.node_groups] == [
        ("workers-lpg1", "lpg1", "workers"),
        ("workers-rma1", "rma1", "workers"),
    ]
    for group in config.node_groups:  # each zone's group gets the entry's sizes and settings
        assert (group.min_size, group.max_size, group.labels) == (1, 4, (("role", "web"),))
        assert group.anti_affinity is True


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"zone": "lpg1", "zones": ["rma1"]},
         ["nodeGroups[0].zones: zone and zones exclude each other: give one zone, or a list"]),
        ({"zones": []}, ["nodeGroups[0].zones: must list at least one zone"]),
        ({"zones": ["lpg1", "lpg1"]}, ['nodeGroups[0].zones[1]: "lpg1" is listed twice']),
        ({"zones": ["LPG1"]}, ["nodeGroups[0].zones[0]: invalid name \"LPG1\": expected a "
                               "DNS-1123 label (lowercase letters, digits and '-', starting "
                               "and ending with a letter or digit)"]),
        ({"zones": "lpg1"}, ['nodeGroups[0].zones: expected a list, got string "lpg1"']),
        ({"antiAffinity": True, "zone": "lpg1",
          "serverGroups": ["5e0a4c1e-0b7a-4d47-8f63-1a2b3c4d5e01"]},
         ["nodeGroups[0].antiAffinity: antiAffinity and serverGroups exclude each other: with "
          "antiAffinity the provider makes and fills the server groups itself; with "
          "serverGroups you name your own"]),
        ({"antiAffinity": "yes"}, ['nodeGroups[0].antiAffinity: expected true or false, got '
                                   'string "yes"']),
        ({"antiAffinity": True}, ["nodeGroups[0].antiAffinity: needs zone (or zones): server "
                                  "groups are zonal, and the provider makes them in the group's "
                                  "zone"]),
        # One error per entry, not one per zone.
        ({"zones": ["lpg1", "rma1"], "minSize": -1},
         ["nodeGroups[0].minSize: must be >= 0, got -1"]),
        # Server groups are zonal: named ones fit one zone only (this loaded, and every create
        # in the other zone was refused).
        ({"zones": ["lpg1", "rma1"], "serverGroups": ["5e0a4c1e-0b7a-4d47-8f63-1a2b3c4d5e01"]},
         ["nodeGroups[0].serverGroups: cannot be combined with zones: a server group is in one "
          "zone, so every create in the others would be refused; use antiAffinity (the provider "
          "makes server groups in each zone), or one group per zone with zone and its "
          "serverGroups"]),
        # Private networks with zones: by name each zone finds its own (this was refused with
        # "zone: required"); by UUID, or with a subnet, only one zone's.
        ({"zones": ["lpg1", "rma1"], "interfaces": [{"network": "7a1c0000-0000-4000-8000-"
                                                                 "000000000001"}]},
         ["nodeGroups[0].interfaces[0].network: a network given by UUID is in one zone, but "
          "`zones` lists several: name the network instead (each zone's network of that name "
          "is used)"]),
        ({"zones": ["lpg1", "rma1"], "interfaces": [
            {"network": "k8s-nodes", "subnet": "7a1c0000-0000-4000-8000-000000000101"}]},
         ["nodeGroups[0].interfaces[0].subnet: a subnet is in one zone, but `zones` lists "
          "several: name the network instead (each zone's network of that name is used), and "
          "leave the subnet out"]),
        # A name that fits alone but not with "-<zone>" (this loaded: the group id was 66
        # characters, past every length check).
        ({"name": "w" * 61, "zones": ["lpg1", "rma1"]},
         [f'nodeGroups[0].name: with zones it makes node group "{"w" * 61}-lpg1", 66 '
          "characters, more than the 63 a name may have; shorten the name to at most 58 "
          "characters",
          f'nodeGroups[0].name: with zones it makes node group "{"w" * 61}-rma1", 66 '
          "characters, more than the 63 a name may have; shorten the name to at most 58 "
          "characters"]),
        ({"name": "w" * 46, "zones": ["lpg1"]},
         [f'nodeGroups[0].name: server names "prod-{"w" * 46}-lpg1-<8 chars>" would be 65 '
          "characters, more than the 63 a host name label allows; shorten the cluster or group "
          'name (with "-lpg1" together at most 53 characters, so at most 48 without it)']),
    ],
    ids=["zone-and-zones", "empty", "twice", "not-a-label", "not-a-list", "with-server-groups",
         "not-a-boolean", "without-zone", "errors-once", "zones-and-server-groups",
         "zones-and-network-uuid", "zones-and-subnet", "fanned-name-too-long",
         "fanned-server-name-too-long"],
)  # fmt: skip
def test_misuse_is_refused_with_its_path(
    tmp_path: Path, fields: dict[str, Any], expected: list[str]
) -> None:
    assert errors_of(write(tmp_path, with_group(**fields))) == expected


def test_zones_with_a_private_network_by_name_load(tmp_path: Path) -> None:
    doc = with_group(zones=["lpg1", "rma1"], interfaces=[{"network": "k8s-nodes"}])
    config = load_config(write(tmp_path, doc), env=ENV)
    assert [(g.zone, g.interfaces) for g in config.node_groups] == [
        ("lpg1", config.node_groups[0].interfaces),
        ("rma1", config.node_groups[0].interfaces),
    ]
    assert config.node_groups[0].interfaces is not None
    assert config.node_groups[0].interfaces[0].network == "k8s-nodes"


def test_a_fanned_out_name_may_not_repeat_another_groups(tmp_path: Path) -> None:
    doc = with_group(zones=["lpg1", "rma1"])
    doc["nodeGroups"].append({**doc["nodeGroups"][0], "name": "workers-rma1", "zones": None})
    del doc["nodeGroups"][1]["zones"]
    doc["nodeGroups"].reverse()
    assert errors_of(write(tmp_path, doc)) == [
        'nodeGroups[1].zones: makes node group "workers-rma1", a name nodeGroups[0] uses too'
    ]


def test_the_pool_label_needs_node_labels_in_the_user_data(tmp_path: Path) -> None:
    """The templates promise the pool label (CA's --balancing-label reads it): the kubelet
    must set it, warned about once for the entry, naming the entry."""
    config = load_config(write(tmp_path, with_group(zones=["lpg1", "rma1"])), env=ENV)
    assert [w for w in config_warnings(config) if "node_labels" in w] == [
        "nodeGroups[0] (workers): has zones (the pool label) but it has no userData for "
        "${node_labels}: real nodes will lack labels the template promises (pass "
        "--node-labels=${node_labels} to the kubelet)"
    ]
    assert LABEL_POOL == "autoscaler.cloudscale.ch/pool"


def readme_pool_example() -> str:
    """The README's config example (its Configure section): a pool in both zones."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("\n## Configure\n", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert "zones: [lpg1, rma1]" in block and "antiAffinity: true" in block, block
    return block


def test_check_config_accepts_the_readmes_pool_example(tmp_path: Path) -> None:
    """With a user data that passes ${node_labels}: no error and no warning."""
    doc = base_doc()
    doc["nodeGroups"] = yaml.safe_load(readme_pool_example())["nodeGroups"]
    doc["stateDir"] = str(tmp_path / "state")
    user_data = "#cloud-config\nruncmd:\n  - kubelet --node-labels=${node_labels}\n"
    config = load_config(write(tmp_path, doc, {"user-data.yaml": user_data}), env=ENV)
    assert [g.name for g in config.node_groups] == ["workers-lpg1", "workers-rma1"]
    assert all(g.anti_affinity and g.max_size == 5 for g in config.node_groups)
    assert config_warnings(config) == []


async def test_the_online_check_names_the_zone_a_flavor_is_not_offered_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], emulator: RunningEmulator
) -> None:
    """The emulator offers its GPU flavors in rma1 only (docs/emulator.md)."""
    gpu = {"name": "gpu", "zones": ["lpg1", "rma1"], "minSize": 0, "maxSize": 1,
           "flavor": "gpu2-128-16-1-200", "image": "debian-12",
           "userData": "#cloud-config\n# --node-labels=${node_labels}\n"}  # fmt: skip
    path = write_checked_config(tmp_path, [gpu], url=emulator.url, token=EMULATOR_TOKEN)
    assert await check_online(path) == 2
    _, err = capsys.readouterr()
    assert failure_lines(err, emulator.url)[1:] == [
        '  nodeGroups[0].flavor: flavor "gpu2-128-16-1-200" is not available in zone "lpg1" '
        "(available in: rma1)"
    ]
