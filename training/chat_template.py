"""The target's chat template: where it comes from, and compiling it as transformers does.

The template is compiled once per process in the sandboxed Jinja environment transformers uses
(or an equivalent one), with faster attribute lookups on plain data and identical results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def compile_template(text: str) -> Any:
    """Compile a chat template in the sandboxed Jinja environment transformers uses.

    A private environment (not transformers' cached one) with faster lookups on plain data.
    """
    try:
        from transformers.utils.chat_template_utils import _cached_compile_jinja_template
    except ImportError:  # another transformers version: an equivalent environment
        template = _fallback_compile(text)
    else:
        template = _cached_compile_jinja_template(text)
    _fast_lookups(template.environment)
    return template


def reads_variable(template: Any, text: str, name: str) -> bool:
    """Whether a compiled template's source reads the variable ``name`` (``tools``, say)."""
    from jinja2 import meta

    return name in meta.find_undeclared_variables(template.environment.parse(text))


_DICT_ATTRS = frozenset(dir(dict))


def _fast_lookups(env: Any) -> None:
    """Speed up the sandbox's attribute checks, with identical results.

    The sandbox's verdict on ``obj.attr`` depends only on the type of ``obj`` and the name
    (``is_internal_attribute`` and ``modifies_known_mutable`` test types, never values), so it
    is cached per (type, name); ``message.content`` on a plain dict skips the failing
    ``getattr`` the sandbox tries before the key lookup.
    """
    slow_getattr, slow_safe = env.getattr, env.is_safe_attribute
    verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        """Return the sandbox's verdict, cached per (type, attribute name)."""
        key = (type(obj), attr)
        known = verdicts.get(key)
        if known is None:
            known = verdicts[key] = bool(slow_safe(obj, attr, value))
        return known

    def getattr_(obj: Any, attribute: str) -> Any:
        """Look up ``obj.attribute``; a plain dict's key directly, as the sandbox would."""
        if type(obj) is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except KeyError:
                return env.undefined(obj=obj, name=attribute)
        return slow_getattr(obj, attribute)

    env.is_safe_attribute = is_safe_attribute
    env.getattr = getattr_


def _fallback_compile(text: str) -> Any:
    """Compile with a Jinja sandbox configured like transformers' chat-template environment."""
    import datetime

    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        """Raise a template error from inside a template."""
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
        """Serialise like transformers: no HTML escaping."""
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.datetime.now().strftime(f)
    return env.from_string(text)


def template_source(tokenizer: Any, chat_template: str | Path | None) -> tuple[str, str]:
    """Return (template text, name for messages) from a file, template text or the tokenizer."""
    if chat_template is not None:
        text = str(chat_template)
        if "{%" in text or "{{" in text:
            return text, "given template"
        path = Path(chat_template)
        return path.read_text(encoding="utf-8"), path.name
    found = getattr(tokenizer, "chat_template", None)
    if isinstance(found, dict):  # several named templates: the default one is what servers use
        found = found.get("default")
    if not isinstance(found, str) or not found:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat template: pass --chat-template"
        )
    return found, f"{tokenizer.name_or_path} chat template"
