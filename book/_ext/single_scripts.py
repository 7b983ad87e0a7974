"""Each page's scripts once: jupyter-book 1.0.4 adds sphinx-thebe's and sphinx-togglebutton's inline scripts twice
to every page (``const THEBE_JS_URL`` declared twice is a JavaScript error on every page); repeats are dropped."""


def _once(app, pagename, templatename, context, doctree):
    seen, kept = set(), []
    for script in context.get("script_files", []):
        attributes = getattr(script, "attributes", {}) or {}
        key = (getattr(script, "filename", None) or None, tuple(sorted((k, str(v)) for k, v in attributes.items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", _once)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
