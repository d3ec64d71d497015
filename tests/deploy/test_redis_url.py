"""How one Redis URL becomes the run store's client and Celery's broker configuration."""

from __future__ import annotations

import ssl

import pytest

from broker.config import celery_config
from common.errors import ConfigError
from common.logs import secrets_of
from common.redis_url import broker_url, parse_sentinel, passwords, tls_options
from common.settings import Settings

SENTINELS = "sentinel://:pw@h1:26379;sentinel://h2:26380;sentinel://h3/2"


def test_a_sentinel_url_gives_every_host_and_the_shared_credentials_and_db():
    target = parse_sentinel(SENTINELS)
    assert target.hosts == [("h1", 26379), ("h2", 26380), ("h3", 26379)]
    assert (target.username, target.password, target.db) == (None, "pw", 2)


def test_the_broker_url_repeats_credentials_and_db_on_every_sentinel_because_kombu_reads_one():
    assert broker_url(SENTINELS) == (
        "sentinel://:pw@h1:26379/2;sentinel://:pw@h2:26380/2;sentinel://:pw@h3:26379/2"
    )


def test_sentinel_parts_that_disagree_on_the_database_are_refused():
    with pytest.raises(ConfigError, match="different databases"):
        parse_sentinel("sentinel://h1:26379/1;sentinel://h2:26379/2")


def test_a_plain_url_is_the_broker_url_unchanged():
    url = "redis://eaglegen:pw@10.0.0.5:6379/3"
    assert broker_url(url) == url
    assert tls_options(url) is None


def test_rediss_checks_the_certificate_even_when_the_url_does_not_say_so():
    assert tls_options("rediss://h:6380/0") == {"ssl_cert_reqs": ssl.CERT_REQUIRED}


def test_rediss_passes_the_url_ssl_options_to_the_broker():
    url = "rediss://h:6380/0?ssl_cert_reqs=optional&ssl_ca_certs=/ca.pem&ssl_check_hostname=false"
    assert tls_options(url) == {
        "ssl_cert_reqs": ssl.CERT_OPTIONAL, "ssl_ca_certs": "/ca.pem", "ssl_check_hostname": False,
    }  # fmt: skip


def test_an_unknown_ssl_cert_reqs_is_refused():
    with pytest.raises(ConfigError, match="ssl_cert_reqs"):
        tls_options("rediss://h:6380/0?ssl_cert_reqs=maybe")


def test_celery_gets_the_tls_options_and_the_sentinel_master_from_the_one_settings_object():
    tls = celery_config(Settings(redis_url="rediss://h:6380/0?ssl_ca_certs=/ca.pem"))
    assert tls["broker_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca.pem"}
    sentinel = celery_config(Settings(redis_url=SENTINELS, redis_sentinel_master="mymaster"))
    assert sentinel["broker_transport_options"]["master_name"] == "mymaster"
    assert sentinel["broker_use_ssl"] is False
    assert sentinel["broker_url"].count("/2") == 3


def test_a_sentinel_url_without_a_master_name_is_a_settings_error():
    with pytest.raises(ValueError, match="EAGLEGEN_REDIS_SENTINEL_MASTER"):
        Settings(redis_url=SENTINELS)


def test_passwords_are_found_as_written_and_percent_decoded_in_every_part():
    assert passwords("redis://u:p%40ss@h/0") == ["p%40ss", "p@ss"]
    assert passwords("sentinel://:a@h1;sentinel://:b@h2/0") == ["a", "b"]


def test_the_redis_password_and_the_api_key_are_secrets_of_a_process():
    settings = Settings(redis_url="redis://u:s3cret-pw@h/0", api_key="sk-abcdef")
    assert set(secrets_of(settings)) == {"sk-abcdef", "s3cret-pw"}


def test_the_redis_url_stays_out_of_the_settings_repr():
    assert "s3cret-pw" not in repr(Settings(redis_url="redis://u:s3cret-pw@h/0"))
