"""The architecture stays readable: no import cycles among the project's modules, and one owner
(``broker/``) for Celery and kombu."""

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
    assert importers <= {"worker.celery_app", "cli.main"}
    for part in ("worker.pipeline.processing", "worker.tasks", "worker.pipeline.reconcile"):
        assert "worker.app" not in edges[part]


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in edges[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def test_the_broker_package_imports_only_common():
    tool = _graph_tool()
    assert tool.package_graph(tool.graph(ROOT))["broker"] <= {"common"}


def test_the_producer_publishes_without_any_worker_module():
    edges = _graph_tool().graph(ROOT)
    for start in ("cli.enqueue_cmd", "producer.enqueue"):
        assert {m for m in _reach(edges, start) if m.split(".")[0] == "worker"} == set(), start


def test_only_the_broker_and_the_workers_task_adapter_import_celery_or_kombu():
    tool = _graph_tool()
    offenders = {
        name
        for name, path in tool.modules(ROOT).items()
        if tool.outside_imports(path) & {"celery", "kombu"}
        and name.split(".")[0] != "broker"
        and name != "worker.tasks"
    }
    assert offenders == set()


def test_every_lua_script_lives_in_common_lua():
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("common", "broker", "worker", "collector", "producer", "cli")
        for path in (ROOT / package).rglob("*.py")
        if path.name != "lua.py" and "redis.call(" in path.read_text()
    ]
    assert offenders == []
