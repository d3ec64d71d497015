"""The routing policy on its own: keys, rendezvous order, affinity, bounded load."""

from __future__ import annotations

import math
from collections import Counter

from common.models import GenParams, TurnResult
from tests.fakes import sample
from worker.endpoints.routing import (
    PREFIX_CHARS,
    Load,
    RouteHint,
    choose,
    hint_for,
    plan,
    prefix_key,
    rendezvous,
)

A, B, C, D = (f"http://{name}/v1" for name in "abcd")
EQUAL = {A: 8, B: 8, C: 8, D: 8}


def _turn(endpoint: str) -> TurnResult:
    return TurnResult(content="ok", finish_reason="stop", endpoint=endpoint)


# -- keys and hints ----------------------------------------------------------------------------


def test_the_key_is_the_leading_prefix_so_one_long_system_prompt_gives_one_key():
    long_system = "You are a careful assistant. " * 200
    assert len(long_system) > PREFIX_CHARS
    assert prefix_key(long_system, "first question") == prefix_key(long_system, "another one")
    assert prefix_key("short", "first question") != prefix_key("short", "another one")
    assert prefix_key(None, "q") == prefix_key("", "q") != prefix_key("other", "q")


def test_a_first_turn_has_no_previous_server_and_a_resumed_sample_has_its_last_turns():
    s = sample("s1", ("first", "second", "third"))
    params = GenParams()
    assert hint_for(s, params, []).previous is None
    resumed = hint_for(s, params, [_turn(A), _turn(B)])
    assert resumed.previous == B and resumed.key == hint_for(s, params, []).key


def test_the_runs_system_prompt_is_part_of_the_key():
    s = sample("s1", ("hello",))
    assert hint_for(s, GenParams(system="one"), []).key != hint_for(s, GenParams(), []).key


def test_the_next_turns_hint_follows_the_server_that_answered():
    hint = RouteHint("k").after(C)
    assert (hint.key, hint.previous) == ("k", C)
    assert hint.after("").previous is None  # an unknown endpoint is no affinity


# -- the order of preference -------------------------------------------------------------------


def test_rendezvous_spreads_keys_in_proportion_to_the_weights():
    firsts = Counter(rendezvous(f"key-{i}", {A: 1, B: 3})[0] for i in range(4000))
    assert 0.70 < firsts[B] / 4000 < 0.80
    equal = Counter(rendezvous(f"key-{i}", EQUAL)[0] for i in range(4000))
    assert all(900 < equal[url] < 1100 for url in EQUAL)


def test_removing_an_endpoint_moves_only_the_keys_it_was_first_for():
    before = {i: rendezvous(f"key-{i}", EQUAL)[0] for i in range(1000)}
    without_d = {url: cap for url, cap in EQUAL.items() if url != D}
    after = {i: rendezvous(f"key-{i}", without_d)[0] for i in range(1000)}
    moved = [i for i in before if before[i] != after[i]]
    assert moved and all(before[i] == D for i in moved)


def test_a_later_turn_prefers_its_previous_server_then_its_keys_order():
    route = plan(RouteHint("k", previous=C), EQUAL)
    assert route.sticky and route.ranking[0] == C
    assert route.ranking[1:] == [url for url in rendezvous("k", EQUAL) if url != C]


def test_a_first_turn_or_a_server_no_longer_configured_is_not_sticky():
    assert plan(RouteHint("k"), EQUAL) == plan(RouteHint("k", "http://gone/v1"), EQUAL)
    assert not plan(RouteHint("k"), EQUAL).sticky
    assert plan(RouteHint("k"), EQUAL).ranking == rendezvous("k", EQUAL)


# -- the choice the script makes ---------------------------------------------------------------


def _loads(*inflight: int, cap: int = 8, out: tuple[str, ...] = ()) -> dict[str, Load]:
    return {
        url: Load(n, cap, url not in out) for url, n in zip((A, B, C, D), inflight, strict=True)
    }


def test_the_first_choice_is_taken_while_its_load_is_within_the_bound():
    assert choose([A, B, C, D], _loads(3, 2, 2, 2), 1.25, wait=True).endpoint == A
    # 11 in flight, mean 3 a server: 1.25 x 12 / 4 = 3.75, so a fourth is the most A takes.
    assert choose([A, B, C, D], _loads(4, 3, 2, 2), 1.25, wait=True).endpoint == B


def test_a_full_first_choice_on_a_busy_cluster_is_waited_for_or_left_for_the_least_loaded():
    loads = _loads(8, 7, 6, 7)  # 28 of 32: A, full, is within 1.25 x its share
    assert choose([A, B, C, D], loads, 1.25, wait=True).wait
    assert choose([A, B, C, D], loads, 1.25, wait=False).endpoint == C


def test_a_drained_or_failing_first_choice_is_never_waited_for():
    loads = _loads(0, 8, 8, 7, out=(A,))
    choice = choose([A, B, C, D], loads, 1.25, wait=True)
    assert choice.endpoint == D and not choice.wait


def test_with_every_slot_taken_there_is_nothing_and_no_wait_for_a_second_choice():
    assert choose([A, B, C, D], _loads(8, 8, 8, 8, out=(A,)), 1.25, wait=True).endpoint is None
    assert not choose([A, B, C, D], _loads(8, 8, 8, 8, out=(A,)), 1.25, wait=True).wait


def test_one_popular_prompt_spreads_within_the_bound_instead_of_piling_onto_one_server():
    ranking = rendezvous("the one system prompt", EQUAL)
    loads = dict.fromkeys(EQUAL, 0)
    for _ in range(24):
        state = {url: Load(n, 8) for url, n in loads.items()}
        picked = choose(ranking, state, 1.25, wait=True).endpoint
        assert picked is not None
        loads[picked] += 1
    assert max(loads.values()) <= math.ceil(1.25 * 24 / 4) and min(loads.values()) > 0
    assert loads[ranking[0]] == max(loads.values())  # its first choice still gets the most


def test_on_a_quiet_cluster_a_few_more_on_the_previous_server_are_within_the_bound():
    quiet = _loads(2, 0, 0, 0)  # 3 of 32 slots with this one: counted as a quarter full
    assert choose([A, B, C, D], quiet, 1.25, wait=True).endpoint == A
    assert choose([A, B, C, D], quiet, 1.25, wait=True, floor=0).endpoint == B


def test_caps_weigh_the_share_of_each_endpoint():
    loads = {A: Load(6, 32), B: Load(2, 8)}  # a quarter full each
    assert choose([B, A], loads, 1.0, wait=False).endpoint == A  # B at its share already
    assert choose([A, B], loads, 1.0, wait=False).endpoint == A
