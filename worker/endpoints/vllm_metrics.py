"""Reading vLLM's Prometheus ``/metrics``: where it is, and the values of named families.

The adaptive caps (gauges: running, waiting, KV-cache usage) and the prefix-cache figures
(counters: tokens looked up and found) both read it.
"""

from __future__ import annotations

from collections.abc import Collection

from prometheus_client.parser import text_string_to_metric_families


def metrics_url(endpoint: str) -> str:
    """vLLM serves /metrics at the root, beside /v1."""
    return endpoint.removesuffix("/v1") + "/metrics"


def family_values(text: str, names: Collection[str]) -> dict[str, list[float]]:
    """Each named family's sample values (one per engine or model), by family name.

    A counter's family is named without ``_total`` and its samples with it; both are found.
    """
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name.removesuffix("_total")
        if name in names:
            wanted = (name, f"{name}_total")
            found.setdefault(name, []).extend(s.value for s in family.samples if s.name in wanted)
    return found
