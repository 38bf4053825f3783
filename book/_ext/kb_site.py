"""Site fixes for the book's build (a local Sphinx extension, loaded from _config.yml).

Two extensions (sphinx-thebe, sphinx-togglebutton) register their inline configuration scripts
twice, so every page declared ``const THEBE_JS_URL`` twice and the browser reported a SyntaxError on
every page (tests/test_site.py fails on script errors). Each page's script list keeps the first of
identical scripts.
"""

from __future__ import annotations


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    """Keep the first of identical scripts (same file, or same inline body) on a page."""
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen, kept = set(), []
    for s in scripts:
        attrs = dict(getattr(s, "attributes", {}) or {})
        other = sorted((k, str(v)) for k, v in attrs.items() if k not in ("body", "priority"))
        key = (str(getattr(s, "filename", s) or ""), str(attrs.get("body")), str(other))  # None and "" alike
        if key not in seen:
            seen.add(key)
            kept.append(s)
    scripts[:] = kept


def setup(app):
    # early: html-page-context stops at the first handler that returns a template (the theme's)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=1)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
