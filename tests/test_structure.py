"""The architecture stays readable: no import cycles among the project's modules."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph_tool():
    spec = importlib.util.spec_from_file_location("module_graph", ROOT / "scripts/module_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_module_imports_itself_back_even_through_lazy_or_type_checking_imports():
    tool = _graph_tool()
    assert tool.cycles(tool.graph(ROOT)) == []


def test_only_the_app_module_wires_the_worker_together():
    edges = _graph_tool().graph(ROOT)
    importers = {m for m, deps in edges.items() if "worker.app" in deps}
    assert importers <= {"worker.celery_app", "cli.main", "cli.enqueue_cmd", "cli.demo"}
    for part in (
        "worker.pipeline.processing",
        "worker.tasks",
        "worker.pipeline.reconcile",
        "broker.publish",
    ):
        assert "worker.app" not in edges[part]


def test_every_lua_script_lives_in_common_lua():
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("common", "broker", "worker", "collector", "producer", "cli")
        for path in (ROOT / package).rglob("*.py")
        if path.name != "lua.py" and "redis.call(" in path.read_text()
    ]
    assert offenders == []
