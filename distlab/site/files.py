"""Writing the site's staged sources: only what changed, so Sphinx re-reads only that."""

from __future__ import annotations

from pathlib import Path


def write_if_changed(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` unless it holds that already; return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text("utf-8") != text:
        path.write_text(text, "utf-8")
    return path


def folder_size(folder: Path) -> tuple[int, int]:
    """Bytes and number of files under ``folder``."""
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()]
    return sum(sizes), len(sizes)
