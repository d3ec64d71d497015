"""Reading a server's prefix-cache counters from its Prometheus text."""

from worker.endpoints.server_cache import CacheCounters, parse_prefix_cache

VLLM = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 800.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 900.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 600.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


def test_the_counters_are_summed_over_engines_and_give_the_hit_rate():
    counters = parse_prefix_cache(VLLM)
    assert counters == CacheCounters(queries=2000.0, hits=1500.0)
    assert counters.hit_rate == 0.75
    assert counters.as_dict() == {"queries": 2000.0, "hits": 1500.0, "hit_rate": 0.75}


def test_counters_without_type_lines_are_read_too():
    text = 'vllm:prefix_cache_queries_total{engine="0"} 10\nvllm:prefix_cache_hits_total 4\n'
    assert parse_prefix_cache(text) == CacheCounters(queries=10.0, hits=4.0)


def test_a_server_without_the_counters_has_none_and_no_lookup_has_no_rate():
    assert parse_prefix_cache("# TYPE x gauge\nx 1\n") is None
    assert CacheCounters(queries=0, hits=0).hit_rate is None
