"""The docs build shows, under each generated section whose measured code changed since it was generated, a note
saying so (tools/figures.py computes it; nothing fails)."""

from __future__ import annotations

import logging
import subprocess

from tools import figures

log = logging.getLogger("mkdocs.hooks.figures")


def on_page_markdown(markdown: str, page, **_) -> str:
    try:
        stale = figures.staleness()
    except (subprocess.CalledProcessError, OSError) as e:  # not a git checkout: nothing to compare against
        log.info("figures: staleness not computed (%s)", e)
        return markdown
    for st in stale:
        section = figures.SECTIONS[st.name]
        if page.file.src_uri != section.doc.removeprefix("docs/"):
            continue
        end = figures.end_marker(st.name)
        at = markdown.find(end)
        if at < 0:
            continue
        _, stamp = figures.find(markdown, st.name)
        after = stamp.end() if stamp else at + len(end)
        markdown = markdown[:after] + f"\n**Older than the code:** {figures.stale_note(st)}\n" + markdown[after:]
    return markdown
