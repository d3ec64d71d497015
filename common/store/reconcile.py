"""What the reconciler reads and repairs in a run: expired leases, lost samples and results."""

from __future__ import annotations

from common import lua
from common.store.base import RunBase


class ReconcileStore(RunBase):
    """The reconciler's view of a run."""

    def reap_expired(self) -> dict[str, str]:
        """Drop leases whose holder stopped renewing them; returns those sample ids, each
        with its holder's token (its request, and no later holder's, is the one to abort)."""
        k = self.keys
        flat = self._script(lua.REAP_EXPIRED)(keys=[k.leases, k.lease_owner, k.reaped])
        return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}

    def reap_expired_leases(self) -> list[str]:
        """``reap_expired``'s sample ids."""
        return list(self.reap_expired())

    def expired_lease_count(self) -> int:
        """Samples whose holder stopped renewing (dead or paused), not yet reaped."""
        return int(self._script(lua.COUNT_EXPIRED)(keys=[self.keys.leases]))

    def pending_ids(self) -> set[str]:
        """Every pending id (bounded by the producer's max_pending)."""
        return {str(x) for x in self.r.sscan_iter(self.keys.pending, count=1000)}

    def still_pending(self, ids: set[str]) -> set[str]:
        """Those of ``ids`` that are still pending."""
        if not ids:
            return set()
        order = list(ids)
        flags = self.r.smismember(self.keys.pending, order)
        return {i for i, flag in zip(order, flags, strict=True) if flag}

    def leased_ids(self) -> set[str]:
        """Ids with a lease (live or not yet reaped)."""
        return {str(x) for x in self.r.zrange(self.keys.leases, 0, -1)}

    def orphan_results(self) -> list[str]:
        """Stored results that neither the ready nor the collecting list names."""
        k = self.keys
        if self.r.hlen(k.results) <= self.r.llen(k.ready) + self.r.llen(k.collecting):
            return []  # the common case, checked in O(1)
        listed = {str(x) for x in self.r.lrange(k.ready, 0, -1)}
        listed |= {str(x) for x in self.r.lrange(k.collecting, 0, -1)}
        return [str(i) for i in self.r.hkeys(k.results) if i not in listed]

    def requeue_result(self, sample_id: str) -> bool:
        """Put a stored result back on the collector's ready list."""
        k = self.keys
        script = self._script(lua.REQUEUE_RESULT)
        return bool(script(keys=[k.pending, k.results, k.ready], args=[sample_id]))
