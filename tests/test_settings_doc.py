"""docs/settings.md is what scripts/settings_doc.py makes of the Settings object: a setting added,
renamed or re-commented without regenerating the page fails here."""

import importlib.util
from pathlib import Path

from common.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("settings_doc", ROOT / "scripts/settings_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_settings_page_is_the_generated_one():
    page = (ROOT / "docs/settings.md").read_text(encoding="utf-8")
    assert page == _generator().render(), "run: python scripts/settings_doc.py"


def test_every_setting_has_one_row_with_its_default():
    rows = [
        line for line in (ROOT / "docs/settings.md").read_text().splitlines() if "| `EAG" in line
    ]
    names = [row.split("`")[1] for row in rows]
    assert names == [f"EAGLEGEN_{name.upper()}" for name in Settings.model_fields]
    row = next(r for r in rows if r.startswith("| `EAGLEGEN_LEASE_TTL`"))
    assert f"`{Settings.model_fields['lease_ttl'].default}`" in row


def test_a_fields_meaning_is_its_own_comment_without_the_section_heading():
    source = """
class Settings:
    # Worker.
    # Seconds a stream may stay silent.
    stall_timeout: float = 1.0
    lease_ttl: float = 2.0  # a dead worker's lease frees itself after this
    # Queued messages a pass reads
    # at most.
    scan_max: int = Field(
        default=3,
    )
    bare: int = 4
"""
    comments = _generator().field_comments(source)
    assert comments == {
        "stall_timeout": "Seconds a stream may stay silent.",
        "lease_ttl": "a dead worker's lease frees itself after this",
        "scan_max": "Queued messages a pass reads at most.",
        "bare": "",
    }


def test_types_and_bounds_read_as_a_variable_is_written():
    gen = _generator()
    fields = Settings.model_fields
    assert gen.type_name(fields["concurrency"].annotation, fields["concurrency"].metadata) == (
        "int ≥ 1"
    )
    assert gen.type_name(fields["token_ids"].annotation, []) == "`auto` | `on` | `off`"
    assert gen.type_name(fields["rpm"].annotation, fields["rpm"].metadata) == "int ≥ 1, optional"
    assert gen.default_text("endpoints") == "`http://127.0.0.1:8000/v1`"
    assert gen.default_text("api_key") == "none"
