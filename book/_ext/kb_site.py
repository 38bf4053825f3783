"""Site fixes for the book's build (a local Sphinx extension, loaded from _config.yml).

Launch (Colab) buttons appear only on chapter pages (notebooks stored as .ipynb), and only once the
repository's address in _config.yml is real: with the placeholder, a button could only lead nowhere.

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


PLACEHOLDER = "REPLACE-ME"


def _no_launch_buttons_without_a_repository(app, config) -> None:
    """With the placeholder address, no page gets a launch button (it could only lead nowhere)."""
    url = str(config.html_theme_options.get("repository_url", "") or "")
    if PLACEHOLDER in url or not url:
        config.html_theme_options["launch_buttons"] = {}


def _launch_buttons_only_on_chapters(app, pagename, templatename, context, doctree) -> None:
    """Pages written in Markdown (intro, reproducing, ...) are no notebooks a reader could launch."""
    source = str(context.get("sourcename") or "")
    if source.endswith((".ipynb", ".ipynb.txt")):
        return
    buttons = context.get("header_buttons")
    if isinstance(buttons, list):
        buttons[:] = [b for b in buttons if not (isinstance(b, dict) and b.get("label") == "launch-buttons")]


def setup(app):
    app.connect("config-inited", _no_launch_buttons_without_a_repository)
    # after sphinx-book-theme's add_launch_buttons (priority 501), before its header is rendered
    app.connect("html-page-context", _launch_buttons_only_on_chapters, priority=502)
    # early: html-page-context stops at the first handler that returns a template (the theme's)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=1)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
