"""``harness view --export DIR``: the viewer's pages as static files that open from disk with no network.

Browsers refuse ``fetch`` from ``file://``, so the run list's data ships as script files beside it: ``data/manifest.js``
sets ``window.VIEWER_MANIFEST`` (the data files, the run count, the page size) and each ``data/runs-NNNN.js`` adds
:data:`CHUNK_RUNS` runs to ``window.RUNS``; ``static/list.js`` loads them one after another (the first page shows
once the first file is in) and filters, sorts and pages in the browser. Each run has its page ``runs/<id>.html``
(:func:`harness.viewer.pages.page_name`), and ``pair.html?a=<id>&b=<id>`` shows two of them side by side.

Layout of ``DIR``::

    .harness-export  index.html  pair.html  static/{viewer.css,list.js,pair.js,favicon.svg}  data/manifest.js  data/runs-0000.js ...  runs/<id>.html ...

Runs are read in batches by keyset paging, so memory holds one batch, not the ledger.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from harness.errors import UsageError
from harness.ledger import Ledger
from harness.viewer.jsdata import js_assign, js_value
from harness.viewer.pages import PAGE_SIZE, Links, list_page, page_name, pair_page, run_page
from harness.viewer.server import STATIC_FILES

__all__ = ["CHUNK_RUNS", "EXPORT_LIST", "ExportSummary", "export_site"]

CHUNK_RUNS = 5000
"""Runs per data file of the run list."""


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote: ``runs`` (run pages), ``data_files`` (``data/runs-NNNN.js``) and ``index`` (the run list)."""

    runs: int
    data_files: int
    index: Path


EXPORT_LIST = ".harness-export"
"""The file at the top of an export listing, one per line, the run pages and data files it wrote: the next export
into the folder removes exactly those (a run it had may be gone), never a file of the user's."""
_LISTED = re.compile(r"(runs/[A-Za-z0-9_-]{1,64}\.html|data/runs-[0-9]{4,}\.js)")
"""What a line of :data:`EXPORT_LIST` may name (an edited line naming anything else is ignored)."""


_MANIFEST_START = b"window.VIEWER_MANIFEST = "
"""How an export's ``data/manifest.js`` starts: a folder whose file of that name starts otherwise is not an export."""


def _prepare(out: Path) -> None:
    """Make ``out``'s folders and remove the run pages and data files its earlier export listed.

    The list is emptied before any file or folder in ``out`` is made, so an export cut short (Ctrl-C) anywhere leaves a
    folder the next export accepts.

    Raises:
        UsageError: ``out`` is a file, holds files but no earlier export (they would be overwritten), or cannot be
            created or written.
    """
    try:  # a name too long or a folder above that cannot be read fails any look at it: one sentence, below
        if out.exists() and not out.is_dir():
            raise UsageError(f"--export {out} is a file, not a folder; pass a folder (it is created if missing).")
        listed = out / EXPORT_LIST
        for folder in (out / "static", out / "data", out / "runs"):  # pages are removed and written there: never via a link
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                kind = "a symbolic link" if folder.is_symlink() else "not a folder"
                raise UsageError(f"--export {out}: {folder} is {kind}, and the export writes only inside its folder; "
                                 "remove it or pass another folder.")  # fmt: skip
        for page in (out / "index.html", out / "pair.html", out / "data" / "manifest.js", listed):  # a folder: said first
            if page.is_dir() and not page.is_symlink():
                raise UsageError(f"--export {out}: {page} is a folder where the export writes a file; remove it or "
                                 "pass another folder.")  # fmt: skip
        if out.is_dir() and not (listed.is_file() or _has_manifest(out)) and any(out.iterdir()):
            raise UsageError(
                f"--export {out} holds files that are not an earlier export, which it could overwrite; "
                "pass a new or empty folder, or one an earlier export wrote."
            )
        # a line that is not UTF-8 names no page of ours: it is ignored like any other line that does not match
        for name in listed.read_text(encoding="utf-8", errors="replace").splitlines() if listed.is_file() else []:
            stale = out / name
            if _LISTED.fullmatch(name) and stale.is_file() and not stale.is_symlink():
                stale.unlink()  # a page of the earlier export: its run may be gone now
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot use {out} as the export folder ({exc.strerror or exc}); pass another folder.") from None
    _write(listed, "")  # listed batch by batch, before its files: an export cut short is listed too
    for sub in ("static", "data", "runs"):
        try:
            (out / sub).mkdir(exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create {out / sub} ({exc.strerror or exc}); pass another export folder.") from None


def _has_manifest(out: Path) -> bool:
    """Whether ``out`` holds an export's ``data/manifest.js`` (one written before exports listed their files)."""
    path = out / "data" / "manifest.js"
    try:
        if not path.is_file():  # none, a folder, a FIFO (opening one would wait for a writer)
            return False
        with path.open("rb") as manifest:
            return manifest.read(len(_MANIFEST_START)) == _MANIFEST_START
    except OSError:  # unreadable
        return False


def _write(path: Path, text: str, *, append: bool = False) -> None:
    """Write ``path`` whole, or with ``append`` add ``text`` at its end. A file already there is replaced (removed, then
    made anew), never written through: a symbolic or hard link's target is not ours, and a FIFO would wait for a reader
    (the list is written whole before it is appended to).

    Raises:
        UsageError: the file cannot be written.
    """
    try:
        if not append:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):  # a folder there: the open below says so
                path.unlink()
        with path.open("a" if append else "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path} ({exc.strerror or exc}); pass another export folder.") from None


def export_site(ledger_path: str | Path, out: Path, *, chunk_runs: int = CHUNK_RUNS,
                progress: Callable[[int], None] | None = None) -> ExportSummary:  # fmt: skip
    """Write the viewer's pages for every run of the ledger into ``out`` (created if missing; the run pages and data
    files an earlier export there listed in :data:`EXPORT_LIST` are removed first, so none is left that the new run
    list does not name; a folder holding other files and no earlier export is refused).

    Args:
        ledger_path: the ledger, opened read-only.
        out: the folder to write.
        chunk_runs: runs per data file.
        progress: called with the number of run pages written so far, after each batch.

    Raises:
        LedgerError: the ledger cannot be opened or read.
        UsageError: ``out`` is a file, holds files but no earlier export, or cannot be created or written.
    """
    with Ledger(ledger_path, readonly=True) as ledger:
        _prepare(out)
        for name in STATIC_FILES:
            _write(out / "static" / name, (resources.files("harness.viewer") / "static" / name).read_text("utf-8"))
        files: list[str] = []
        runs = 0
        run_links = Links(served=False, depth=1)
        for batch in ledger.iter_run_list(batch=chunk_runs):
            name = f"runs-{len(files):04d}.js"
            for row in batch:
                row["page"] = page_name(row["run_id"])
            _write(out / EXPORT_LIST, "".join([*(f"runs/{row['page']}.html\n" for row in batch), f"data/{name}\n"]), append=True)
            for row in batch:
                _write(out / "runs" / f"{row['page']}.html", run_page(ledger, row["run_id"], run_links))
            _write(out / "data" / name, f"window.RUNS = (window.RUNS || []).concat({js_value(batch)});\n")
            files.append(f"data/{name}")
            runs += len(batch)
            if progress is not None:
                progress(runs)
        manifest = {"files": files, "total": runs, "page_size": PAGE_SIZE}
        _write(out / "data" / "manifest.js", js_assign("window.VIEWER_MANIFEST", manifest))
        _write(out / "index.html", list_page(ledger, {}, Links(served=False), static=True))
        _write(out / "pair.html", pair_page(None, None, None, Links(served=False)))
    return ExportSummary(runs, len(files), out / "index.html")
