"""Entry point for the plain ``celery`` command: ``celery -A worker.celery_app worker``.

This module reads the environment when imported, which is its only purpose; EagleGen's own
code builds apps with ``worker.app.create_app(settings)`` instead (and publishes with
``broker.app.create_broker_app(settings)``).
"""

from common.settings import Settings
from worker.app import create_app

app = create_app(Settings())
