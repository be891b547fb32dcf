"""Hypothesis strategies for emulator fault sets (PUT /_emulator/faults).

Intensities are chosen so that a provider honouring CA's 5 s deadline can always answer in
time (the client's own retry budget permitting), while still failing many single requests.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# Endpoints the provider uses in the campaign; "*" applies to all of them.
ENDPOINTS = ("*", "list_servers", "create_server", "delete_server")
ZONES = ("lpg1", "rma1")


def _per_endpoint(spec: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(ENDPOINTS), spec, min_size=1, max_size=2)


error_rates = _per_endpoint(
    st.fixed_dictionaries(
        {
            "rate": st.sampled_from([0.1, 0.2, 0.3]),
            "status": st.sampled_from([500, 502, 503, 504]),
        }
    )
)
rate_limits = _per_endpoint(
    st.fixed_dictionaries(
        {"rate": st.sampled_from([0.1, 0.25]), "retry_after": st.sampled_from([0, 1])}
    )
)
latencies = _per_endpoint(
    st.fixed_dictionaries(
        {"fixed_ms": st.sampled_from([5, 50, 150]), "jitter_ms": st.sampled_from([0, 50, 100])}
    )
)

fault_sets: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {},
    optional={
        "error_rate": error_rates,
        "rate_limit": rate_limits,
        "latency": latencies,
        "quota": st.fixed_dictionaries({"max_servers": st.integers(0, 10)}),
        "fail_next_creates": st.fixed_dictionaries(
            {
                "count": st.integers(1, 3),
                "kind": st.sampled_from(["quota", "capacity", "server_error", "invalid"]),
            }
        ),
        "zones_out_of_capacity": st.lists(st.sampled_from(ZONES), min_size=1, unique=True),
        "lose_create_responses": st.fixed_dictionaries(
            {"count": st.integers(1, 2), "mode": st.sampled_from(["drop", "504"])}
        ),
        "slow_deletes_seconds": st.sampled_from([0.3, 1.0]),
    },
).filter(bool)
