"""MkDocs hook: gsd's docstrings name objects with Sphinx roles (:class:`RankConfig`, :mod:`.executors`).

mkdocstrings renders the role's text as inline code and leaves the role's name in front of it
(":class:<code>RankConfig</code>"); this drops the name, so the API reference reads as the docstring
means. Nothing else on any page is changed."""

import re

_ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|attr|data|exc|obj|const|func):(?=<code)")


def on_page_content(html, page, config, files):
    return _ROLE.sub("", html)
