"""Every Lua script EagleGen runs in Redis, in one package: ``lua.NAME`` for each.

A transition that touches more than one key is one script, so a crash between two steps cannot
leave a sample half-moved. Times come from the Redis clock (``NOW_MS``), never from the
caller's: workers on many hosts with drifting clocks agree on when a lease expires.
Callers register a script with ``client.register_script(lua.NAME)`` and keep the handle.
"""

from common.lua.clock import (
    NOW_MS,
)
from common.lua.endpoints import (
    GCRA,
    SLOT_ACQUIRE,
    SLOT_RELEASE,
    SLOT_RENEW,
    SLOT_RESTORE,
    SLOT_ROUTE,
    SLOT_SNAPSHOT,
)
from common.lua.lifecycle import (
    COLLECTOR_LOCK,
    COLLECTOR_UNLOCK,
    COMMIT_COLLECTED,
    ENSURE_RUN,
    PIN_MODEL,
    PRUNE_CLOCKS,
    RETIRE_RUN,
    STATS_WRITE,
    TAKE_OUT_ENDPOINT,
    TAKE_READY,
)
from common.lua.samples import (
    ACCEPT,
    COUNT_EXPIRED,
    INCR_COUNTER,
    IS_HOLDER,
    LEASE_RELEASE,
    LEASE_RENEW,
    LEASE_TAKE,
    POP_OWN_REQUEST,
    PRODUCER_BEAT,
    REAP_EXPIRED,
    REQUEUE_FAILED,
    REQUEUE_RESULT,
    SAVE_CHECKPOINT,
    SAVE_PARTIAL,
    SAVE_REQUEST,
    STORE_FAILURE,
    STORE_RESULT,
)

__all__ = [
    "ACCEPT",
    "COLLECTOR_LOCK",
    "COLLECTOR_UNLOCK",
    "COMMIT_COLLECTED",
    "COUNT_EXPIRED",
    "ENSURE_RUN",
    "GCRA",
    "INCR_COUNTER",
    "IS_HOLDER",
    "LEASE_RELEASE",
    "LEASE_RENEW",
    "LEASE_TAKE",
    "NOW_MS",
    "PIN_MODEL",
    "POP_OWN_REQUEST",
    "PRODUCER_BEAT",
    "PRUNE_CLOCKS",
    "REAP_EXPIRED",
    "REQUEUE_FAILED",
    "REQUEUE_RESULT",
    "RETIRE_RUN",
    "SAVE_CHECKPOINT",
    "SAVE_PARTIAL",
    "SAVE_REQUEST",
    "SLOT_ACQUIRE",
    "SLOT_RELEASE",
    "SLOT_RENEW",
    "SLOT_RESTORE",
    "SLOT_ROUTE",
    "SLOT_SNAPSHOT",
    "STATS_WRITE",
    "STORE_FAILURE",
    "STORE_RESULT",
    "TAKE_OUT_ENDPOINT",
    "TAKE_READY",
]
