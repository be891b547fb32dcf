"""The provider's config inside rendered Kubernetes manifests (pure): what `helm template` or
`kustomize build` print, so CI can lint the config a chart or an overlay really installs."""

from __future__ import annotations

from typing import Any

import yaml

# The key of the provider's ConfigMap that holds the config file (chart and kustomize base).
CONFIG_KEY = "config.yaml"


class ManifestProblem(ValueError):
    """Kubernetes objects without exactly one ConfigMap holding a provider config."""


def _is_object(doc: Any) -> bool:
    return isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc


def _name(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    namespace = meta.get("namespace")
    name = meta.get("name", "<unnamed>")
    return f"{namespace}/{name}" if namespace else str(name)


def config_in_manifests(text: str) -> tuple[str, str] | None:
    """(`ConfigMap <namespace>/<name>`, its config.yaml) when `text` is a stream of
    Kubernetes objects; None when it is not (a config file, or not YAML at all: the config
    loader says what is wrong with it). Raises ManifestProblem when the objects hold no
    ConfigMap with a config.yaml key, or several."""
    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError:
        return None
    if not docs or not all(_is_object(doc) for doc in docs):
        return None
    found = [
        (f"ConfigMap {_name(doc)}", doc["data"][CONFIG_KEY])
        for doc in docs
        if doc["kind"] == "ConfigMap"
        and isinstance(doc.get("data"), dict)
        and isinstance(doc["data"].get(CONFIG_KEY), str)
    ]
    if len(found) != 1:
        names = ", ".join(where for where, _ in found) or "none"
        raise ManifestProblem(
            f"expected exactly one ConfigMap with a {CONFIG_KEY} key among the "
            f"{len(docs)} Kubernetes objects, found {len(found)} ({names})"
        )
    return found[0]
