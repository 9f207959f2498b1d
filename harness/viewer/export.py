"""``harness view --export DIR``: the viewer's pages as static files that open from disk with no network.

Browsers refuse ``fetch`` from ``file://``, so the run list's data ships as script files beside it: ``data/manifest.js``
sets ``window.VIEWER_MANIFEST`` (the data files, the run count, the page size) and each ``data/runs-NNNN.js`` adds
:data:`CHUNK_RUNS` runs to ``window.RUNS``; ``static/list.js`` loads them one after another (the first page shows
once the first file is in) and filters, sorts and pages in the browser. Each run has its page ``runs/<id>.html``
(:func:`harness.viewer.pages.page_name`), and ``pair.html?a=<id>&b=<id>`` shows two of them side by side.

Layout of ``DIR``::

    index.html  pair.html  static/{viewer.css,list.js,pair.js,favicon.svg}  data/manifest.js  data/runs-0000.js ...  runs/<id>.html ...

Runs are read in batches by keyset paging, so memory holds one batch, not the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from harness.errors import UsageError
from harness.ledger import Ledger
from harness.viewer.jsdata import js_assign, js_value
from harness.viewer.pages import PAGE_SIZE, Links, list_page, page_name, pair_page, run_page
from harness.viewer.server import STATIC_FILES

__all__ = ["CHUNK_RUNS", "ExportSummary", "export_site"]

CHUNK_RUNS = 5000
"""Runs per data file of the run list."""


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote: ``runs`` (run pages), ``data_files`` (``data/runs-NNNN.js``) and ``index`` (the run list)."""

    runs: int
    data_files: int
    index: Path


def _prepare(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--export {out} is a file, not a folder; pass a folder (it is created if missing).")
    try:
        for sub in ("static", "data", "runs"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        for stale in [*(out / "runs").glob("*.html"), *(out / "data").glob("runs-*.js")]:
            if stale.is_file() and not stale.is_symlink():  # pages of an earlier export: a run it had may be gone now
                stale.unlink()
    except OSError as exc:
        raise UsageError(f"cannot create the export folder {out} ({exc.strerror or exc}); pass another folder.") from None


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path} ({exc.strerror or exc}); pass another export folder.") from None


def export_site(ledger_path: str | Path, out: Path, *, chunk_runs: int = CHUNK_RUNS,
                progress: Callable[[int], None] | None = None) -> ExportSummary:  # fmt: skip
    """Write the viewer's pages for every run of the ledger into ``out`` (created if missing; the run pages and data
    files of an earlier export there are removed first, so none is left that the new run list does not name).

    Args:
        ledger_path: the ledger, opened read-only.
        out: the folder to write.
        chunk_runs: runs per data file.
        progress: called with the number of run pages written so far, after each batch.

    Raises:
        LedgerError: the ledger cannot be opened or read.
        UsageError: ``out`` is a file, or cannot be created or written.
    """
    with Ledger(ledger_path, readonly=True) as ledger:
        _prepare(out)
        for name in STATIC_FILES:
            _write(out / "static" / name, (resources.files("harness.viewer") / "static" / name).read_text("utf-8"))
        files: list[str] = []
        runs = 0
        run_links = Links(served=False, depth=1)
        for batch in ledger.iter_run_list(batch=chunk_runs):
            for row in batch:
                row["page"] = page_name(row["run_id"])
                _write(out / "runs" / f"{row['page']}.html", run_page(ledger, row["run_id"], run_links))
            name = f"runs-{len(files):04d}.js"
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
