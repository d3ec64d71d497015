"""The pure parts of capacity control: the adaptive cap, endpoint health, rate math, settings."""

import pytest

from common import errors
from common.settings import Settings
from worker.endpoints.adaptive import (
    CapState,
    Limits,
    ServerLoad,
    next_cap,
    parse_metrics,
)
from worker.endpoints.health import EndpointHealth, counts_against
from worker.endpoints.ratelimit import gcra
from worker.endpoints.vllm_metrics import metrics_url

LIMITS = Limits(low=1, high=512)


def _full(running: int, waiting: int = 0, kv: float | None = None) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting, kv_usage=kv)


# -- the adaptive cap ----------------------------------------------------------------------


def test_the_cap_grows_by_half_while_the_server_runs_everything_we_send():
    state = next_cap(CapState(8), _full(8), inflight=8, limits=LIMITS)
    assert state.cap == 12 and state.ceiling is None


def test_the_cap_drops_to_what_the_server_runs_plus_a_small_queue_once_it_queues_more():
    state = next_cap(CapState(40), _full(32, waiting=8), inflight=40, limits=LIMITS)
    assert (state.cap, state.ceiling) == (32 + 4, 32)  # 10% of 32 may wait, rounded up


def test_a_small_queue_on_a_full_server_holds_the_cap():
    state = next_cap(CapState(35), _full(32, waiting=3), inflight=35, limits=LIMITS)
    assert (state.cap, state.ceiling) == (35, 32)


def test_with_no_headroom_the_cap_drops_to_exactly_what_the_server_runs():
    limits = Limits(headroom=0)
    assert next_cap(CapState(40), _full(32, waiting=8), 40, limits).cap == 32


def test_the_cap_never_rises_on_a_queue_even_if_others_fill_the_server():
    state = next_cap(CapState(10), _full(32, waiting=9), inflight=10, limits=LIMITS)
    assert state.cap == 10


def test_the_cap_holds_while_our_slots_are_not_all_taken():
    state = next_cap(CapState(16), _full(9), inflight=9, limits=LIMITS)
    assert state.cap == 16


def test_the_cap_holds_when_the_kv_cache_is_full():
    state = next_cap(CapState(16), _full(16, kv=0.99), inflight=16, limits=LIMITS)
    assert state.cap == 16


def test_above_a_known_capacity_the_cap_probes_one_slot_after_quiet_reads():
    state = CapState(36, ceiling=32)  # 32 run, 4 may wait
    caps = []
    for _ in range(4):
        state = next_cap(state, _full(32), inflight=36, limits=LIMITS)
        caps.append(state.cap)
    assert caps == [36, 36, 37, 37]


def test_below_a_known_capacity_the_cap_recovers_at_once_up_to_it():
    state = next_cap(CapState(20, ceiling=32), _full(20), inflight=20, limits=LIMITS)
    assert state.cap == 30
    state = next_cap(state, _full(30), inflight=30, limits=LIMITS)
    assert state.cap == 36


def test_probes_that_keep_succeeding_bring_back_fast_growth():
    state = CapState(38, ceiling=32, quiet=5)
    state = next_cap(state, _full(38), inflight=38, limits=LIMITS)
    assert state.ceiling is None and state.cap == 57


def test_the_cap_stays_within_its_limits():
    limits = Limits(low=2, high=20)
    assert next_cap(CapState(16), _full(16), 16, limits).cap == 20
    assert next_cap(CapState(4), _full(0, waiting=9), 4, limits).cap == 2


def _simulate(capacity_at, steps: int, start: int = 64) -> list[tuple[int, int]]:
    """A server that runs min(cap, capacity) and queues the rest; demand never runs out."""
    state, trace = CapState(start), []
    for step in range(steps):
        capacity = capacity_at(step)
        load = _full(min(state.cap, capacity), waiting=max(0, state.cap - capacity))
        trace.append((state.cap, load.waiting))
        state = next_cap(state, load, inflight=state.cap, limits=LIMITS)
    return trace


def _settled(trace: list[tuple[int, int]], capacity: int) -> bool:
    """The server full, with no more than its headroom (plus one probe) waiting."""
    queue = LIMITS.queue(capacity)
    return all(capacity <= cap <= capacity + queue + 1 for cap, _ in trace)


def test_the_cap_finds_the_capacity_and_keeps_the_queue_small():
    trace = _simulate(lambda step: 24, steps=60)
    assert _settled(trace[10:], 24)
    assert max(waiting for _, waiting in trace[10:]) <= LIMITS.queue(24) + 1


def test_the_cap_follows_the_capacity_when_it_changes_mid_run():
    trace = _simulate(lambda step: 24 if step < 30 else 48, steps=60, start=4)
    assert _settled(trace[20:30], 24)
    assert _settled(trace[45:], 48)
    trace = _simulate(lambda step: 48 if step < 30 else 16, steps=45)
    assert _settled(trace[33:], 16)


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 30.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 5.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="qwen"} 0.75
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="qwen"} 1234.0
"""


def test_vllm_metrics_are_summed_over_engines_and_the_old_kv_name_is_read():
    assert parse_metrics(VLLM_METRICS) == ServerLoad(running=32, waiting=5, kv_usage=0.75)


def test_metrics_without_the_queue_gauges_are_refused():
    with pytest.raises(ValueError, match="num_requests_running"):
        parse_metrics("# TYPE up gauge\nup 1\n")


def test_the_metrics_live_beside_v1():
    assert metrics_url("http://gpu-1:8000/v1") == "http://gpu-1:8000/metrics"


# -- endpoint health -----------------------------------------------------------------------


def test_an_endpoint_is_taken_out_after_failures_in_a_row_only():
    health = EndpointHealth(threshold=3, cooldown=10)
    assert not health.failure(0)
    assert not health.failure(0)
    health.success()
    assert not health.failure(1)
    assert not health.failure(1)
    assert health.failure(1) and health.out


def test_an_endpoint_found_down_at_start_is_out_until_its_first_probe():
    health = EndpointHealth(threshold=5, cooldown=10)
    health.mark_down(0)
    assert health.out and not health.probe_due(9) and health.probe_due(10)


def test_an_endpoint_out_is_probed_after_its_cool_down_which_doubles_on_each_failed_probe():
    health = EndpointHealth(threshold=1, cooldown=10, max_cooldown=25)
    health.failure(100)
    assert not health.probe_due(109) and health.probe_due(110)
    health.probe_failed(110)
    assert health.out_until == 130
    health.probe_failed(130)
    assert health.out_until == 155  # capped at max_cooldown
    assert health.success() and not health.out and health.failures == 0


def test_only_failures_of_the_server_itself_count_against_it():
    assert counts_against(errors.ConnectError("x")) and counts_against(errors.ServerError("x"))
    assert not counts_against(errors.RateLimited("busy, alive"))
    assert not counts_against(errors.BadRequest("our fault"))
    assert not counts_against(errors.StallError("one slow generation"))


# -- rate math ----------------------------------------------------------------------------


def test_requests_are_paced_one_interval_apart():
    tat, wait = gcra(tat=0, now=1000, cost=1, interval=100, burst=100)
    assert (tat, wait) == (1100, 0)
    assert gcra(tat, now=1040, cost=1, interval=100, burst=100) == (1100, 60)
    assert gcra(tat, now=1100, cost=1, interval=100, burst=100) == (1200, 0)


def test_a_burst_allowance_admits_that_much_ahead_of_schedule():
    tat, admitted = 0.0, 0
    for _ in range(10):
        new_tat, wait = gcra(tat, now=0, cost=1, interval=10, burst=50)
        if wait == 0:
            tat, admitted = new_tat, admitted + 1
    assert admitted == 5


def test_tokens_overspent_make_the_next_request_wait_until_they_are_paid_off():
    tat, _ = gcra(tat=0, now=0, cost=3000, interval=0.6, burst=1e9)  # charged after the fact
    tat, wait = gcra(tat, now=1000, cost=0, interval=0.6, burst=0)
    assert wait == pytest.approx(800)
    assert gcra(tat, now=1800, cost=0, interval=0.6, burst=0)[1] == 0


# -- settings -----------------------------------------------------------------------------


def test_per_endpoint_caps_override_the_default_cap():
    settings = Settings(max_inflight=16, endpoint_caps="http://a:1/v1/=4, http://b:2/v1=40")
    assert settings.cap_for("http://a:1/v1") == 4
    assert settings.cap_for("http://b:2/v1") == 40
    assert settings.cap_for("http://c:3/v1") == 16


def test_malformed_or_zero_endpoint_caps_are_refused():
    with pytest.raises(ValueError, match="URL=N"):
        Settings(endpoint_caps="http://a:1/v1")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        Settings(endpoint_caps="http://a:1/v1=0")
