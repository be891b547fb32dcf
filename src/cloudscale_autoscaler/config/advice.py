"""Warnings about a valid config that will not behave as its author likely expects (pure).

Printed by `check-config` and logged by `serve` at start; never a reason to refuse.
"""

from __future__ import annotations

from cloudscale_autoscaler.settings.types import Config, NodeGroupConfig, with_entries
from cloudscale_autoscaler.template.slug import flavor_from_slug
from cloudscale_autoscaler.template.userdata import UserDataError, placeholders_in


def config_warnings(config: Config) -> list[str]:
    # One entry's zones share its user data and labels: warned about once, for the entry.
    entries = dict(reversed(with_entries(config.node_groups)))
    warnings = [w for i, g in sorted(entries.items()) for w in _placeholder_warnings(i, g)]
    options = [g.name for g in config.node_groups if g.autoscaling_options is not None]
    if options:
        warnings.append(options_warning(options))
    return warnings


def options_warning(groups: list[str]) -> str:
    return (
        f"node group(s) {', '.join(groups)} set autoscalingOptions: Cluster Autoscaler 1.35 "
        "and later then use a MaxNodeStartupTime of 0 for them (kubernetes/autoscaler#10245, "
        "not fixed in any release), so every new node counts as unready from the moment it "
        "registers until it is Ready, and a large scale-up can make CA pause scaling; leave "
        "autoscalingOptions out unless you need it (docs/configuration.md, Autoscaling options)"
    )


def _placeholder_warnings(index: int, group: NodeGroupConfig) -> list[str]:
    try:
        used = set(placeholders_in(group.user_data or ""))
    except UserDataError:
        return []  # the loader reports malformed user data as an error already
    flavor = flavor_from_slug(group.flavor)
    gpu = flavor is not None and flavor.gpu is not None
    at = f"nodeGroups[{index}] ({group.pool or group.name})"
    where = "its userData does not use" if group.user_data is not None else "it has no userData for"
    warnings = []
    if (group.labels or gpu or group.pool) and "node_labels" not in used:
        reasons = (
            ("labels", bool(group.labels)),
            ("a GPU flavor", gpu),
            ("zones (the pool label)", group.pool is not None),
        )
        what = " and ".join(part for part, present in reasons if present)
        warnings.append(
            f"{at}: has {what} but {where} ${{node_labels}}: real nodes will lack labels the "
            "template promises (pass --node-labels=${node_labels} to the kubelet)"
        )
    if group.taints and "node_taints" not in used:
        warnings.append(
            f"{at}: has taints but {where} ${{node_taints}}: real nodes will lack taints the "
            "template promises (pass --register-with-taints=${node_taints} to the kubelet)"
        )
    return warnings
