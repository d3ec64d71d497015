"""Quiet by default: per-task and per-request lines only at DEBUG."""

import logging

import pytest

from common.logs import CHATTY, setup_logging
from common.settings import Settings


@pytest.fixture(autouse=True)
def _restore_logging():
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in CHATTY})
    yield
    root.handlers[:], level, levels = saved
    root.setLevel(level)
    for name, chatty_level in levels.items():
        logging.getLogger(name).setLevel(chatty_level)


def test_at_info_celerys_per_task_and_httpxs_per_request_lines_are_dropped_but_problems_kept():
    setup_logging(Settings(), "INFO")
    for name in CHATTY:
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)
        assert logging.getLogger(name).isEnabledFor(logging.WARNING)
    assert logging.getLogger("eaglegen.worker").isEnabledFor(logging.INFO)  # the summary


def test_at_debug_they_are_all_back():
    setup_logging(Settings(), "DEBUG")
    for name in CHATTY:
        assert logging.getLogger(name).isEnabledFor(logging.INFO)
