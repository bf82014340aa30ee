"""In-memory rate limits and the cost ledger."""

from __future__ import annotations

from agboss_sql.contracts.keys import checked_identifier
from agboss_sql.contracts.rules import (
    NO_TENANT,
    checked_budget_key,
    checked_cost_entry,
    checked_count,
    checked_int,
    checked_positive_ms,
    checked_time,
)
from agboss_sql.contracts.stores import CostLedgerRepository, RateLimitRepository
from agboss_sql.contracts.types import (
    BudgetScope,
    CostEntry,
    CostTotal,
    WindowResult,
)
from agboss_sql.memory._fencing import ApplicationClockStore, StoreClockStore, store_now
from agboss_sql.memory.backend import WindowRow


class InMemoryRateLimitRepository(StoreClockStore, RateLimitRepository):
    """Rate limits in an `InMemoryBackend`, on the store's time (as the SQL store): with
    `StoreClock()` the host's clock, which every instance of one in-process cluster shares;
    `StoreClock(clock)` in tests.

    Each method counts and takes without awaiting in between: one atomic step on the event
    loop. A slot is live while `expires_at > now`, as a lease is. A window is a fixed window
    aligned to a multiple of `window_ms`, one counter per key: a key counts in one window
    size (asked with another size, its count restarts whenever the window start differs).
    """

    def _now(self) -> int:
        return store_now(self.store_clock)

    def _live_slots(self, key: str, now: int) -> dict[str, int]:
        slots = self.memory.slots.setdefault(key, {})
        for holder in [h for h, expires_at in slots.items() if expires_at <= now]:
            del slots[holder]
        return slots

    async def acquire_slot(self, key: str, holder: str, max_slots: int, ttl_ms: int) -> bool:
        checked_identifier("key", key)
        checked_identifier("holder", holder)
        checked_count("max_slots", max_slots)
        checked_positive_ms("ttl_ms", ttl_ms)
        now = self._now()
        slots = self._live_slots(key, now)
        if holder in slots:
            slots[holder] = max(slots[holder], now + ttl_ms)
            return True
        if len(slots) >= max_slots:
            return False
        slots[holder] = now + ttl_ms
        return True

    async def renew_slot(self, key: str, holder: str, ttl_ms: int) -> bool:
        checked_identifier("key", key)
        checked_identifier("holder", holder)
        checked_positive_ms("ttl_ms", ttl_ms)
        now = self._now()
        slots = self._live_slots(key, now)
        if holder not in slots:
            return False
        slots[holder] = max(slots[holder], now + ttl_ms)
        return True

    async def release_slot(self, key: str, holder: str) -> None:
        checked_identifier("key", key)
        checked_identifier("holder", holder)
        self.memory.slots.get(key, {}).pop(holder, None)

    async def add_to_window(
        self, key: str, window_ms: int, amount: int, limit: int
    ) -> WindowResult:
        checked_identifier("key", key)
        checked_positive_ms("window_ms", window_ms)
        checked_count("amount", amount)
        checked_count("limit", limit)
        now = self._now()
        start = now - now % window_ms
        window = self.memory.windows.get(key)
        if window is None or window.start != start:
            window = WindowRow(start=start, used=0)
            self.memory.windows[key] = window
        allowed = window.used + amount <= limit
        if allowed:
            window.used += amount
        return WindowResult(allowed=allowed, used=window.used, resets_at=start + window_ms)

    async def pause_until(self, key: str, until: int) -> None:
        checked_identifier("key", key)
        checked_time("until", until)
        current = self.memory.rate_pauses.get(key)
        if current is None or until > current:
            self.memory.rate_pauses[key] = until

    async def paused_until(self, key: str) -> int | None:
        checked_identifier("key", key)
        until = self.memory.rate_pauses.get(key)
        if until is None or until <= self._now():
            return None
        return until


def _matches(scope: BudgetScope, key: str, tenant: str, entry: CostEntry) -> bool:
    if tenant != NO_TENANT and entry.tenant_id != tenant:
        return False
    if scope is BudgetScope.EXECUTION:
        return entry.execution_id == key
    if scope is BudgetScope.TENANT:
        return entry.tenant_id == key
    return entry.application == key


class InMemoryCostLedgerRepository(ApplicationClockStore, CostLedgerRepository):
    """Spend in an `InMemoryBackend`: entries recorded once by id, reservations per scope key.

    Reservations are one running sum per scope and key: they count (as cost, no tokens) in
    every `total` of that scope and key, whatever `since`.
    """

    async def record(self, entry: CostEntry) -> bool:
        checked_cost_entry(entry)
        key = (entry.tenant_id, entry.entry_id)
        if key in self.memory.cost_entries:
            return False
        self.memory.cost_entries[key] = entry
        return True

    def _total(self, scope: BudgetScope, key: str, tenant: str, since: int | None) -> CostTotal:
        tokens_in = tokens_out = cost_micros = 0
        for entry in self.memory.cost_entries.values():
            if _matches(scope, key, tenant, entry) and (since is None or entry.at >= since):
                tokens_in += entry.tokens_in
                tokens_out += entry.tokens_out
                cost_micros += entry.cost_micros
        cost_micros += self.memory.reservations.get((scope, tenant, key), 0)
        return CostTotal(tokens_in, tokens_out, cost_micros)

    async def total(
        self,
        scope: BudgetScope,
        key: str,
        since: int | None = None,
        *,
        tenant_id: str | None = None,
    ) -> CostTotal:
        _, tenant = checked_budget_key(scope, key, tenant_id)
        if since is not None:
            checked_int("since", since)
        return self._total(BudgetScope(scope), key, tenant, since)

    async def try_reserve(
        self,
        scope: BudgetScope,
        key: str,
        amount_micros: int,
        limit_micros: int,
        *,
        tenant_id: str | None = None,
    ) -> bool:
        _, tenant = checked_budget_key(scope, key, tenant_id)
        scope = BudgetScope(scope)
        checked_count("amount_micros", amount_micros)
        checked_count("limit_micros", limit_micros)
        spent = self._total(scope, key, tenant, None).cost_micros
        if spent + amount_micros > limit_micros:
            return False
        slot = (scope, tenant, key)
        self.memory.reservations[slot] = self.memory.reservations.get(slot, 0) + amount_micros
        return True
