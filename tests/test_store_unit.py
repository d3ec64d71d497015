"""The Redis client's own settings and the processor's store retry, without a server."""

import redis

from common.settings import Settings
from common.store import SOCKET_TIMEOUT_S, connect
from tests.fakes import FakeClient, FakeEndpoints, FakeObserver, FakeStore, sample, turn
from worker.pipeline.leases import LeaseKeeper
from worker.pipeline.processing import SampleProcessor


def test_every_state_connection_has_a_command_deadline():
    client = connect("redis://127.0.0.1:1/0")  # nothing is contacted until a command
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == SOCKET_TIMEOUT_S and kwargs["socket_connect_timeout"] == 5


def test_a_finished_answer_survives_a_redis_blip_at_its_store():
    store = FakeStore()
    store.add(sample("a"))
    real_store = store.store_result
    blips = iter([redis.ConnectionError("restarting"), redis.TimeoutError("stalled")])

    def flaky(*args, **kwargs):
        for exc in blips:
            raise exc
        return real_store(*args, **kwargs)

    store.store_result = flaky
    settings = Settings(store_retry_s=30)
    client = FakeClient(turn())
    proc = SampleProcessor(
        settings, lambda run: store, FakeEndpoints(client), LeaseKeeper(lambda run: store, 45),
        FakeObserver(),
    )  # fmt: skip
    assert proc.process("r", "a") == "done"
    assert len(client.calls) == 1 and "a" in store.results  # stored, not generated again
