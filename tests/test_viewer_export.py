"""``harness view --export DIR`` into folders an earlier export, a cut-short export or the user left (red team).

Each test exports a real ledger into a real folder; the folder's files are read back.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import harness.viewer.export as export
from harness.errors import UsageError
from harness.ledger import Ledger
from harness.viewer import export_site
from harness.viewer.export import EXPORT_LIST
from tests.helpers import assert_one_sentence_error, cli
from tests.ledger_builders import SMALL, add_run


@pytest.fixture
def ledger(tmp_path) -> Path:
    path = tmp_path / "l.sqlite"
    with Ledger(path) as opened:
        add_run(opened, "run-a", model=SMALL, repetition=0)
        add_run(opened, "run-b", model=SMALL, repetition=1)
    return path


def _files(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize("cut_at", [1, 2, 3, 5, 7, 9])
def test_an_export_cut_short_anywhere_leaves_a_folder_the_next_export_accepts(ledger, tmp_path, monkeypatch, cut_at):
    """red team: a Ctrl-C after the folders were made and before the list was written (the static files are written
    between them) left a folder of export files with neither the list nor a manifest: the next export refused it."""
    whole = tmp_path / "whole"
    export_site(ledger, whole, chunk_runs=1)
    out, written, real_write = tmp_path / "cut", [], export._write

    def write(path: Path, text: str, **how: bool) -> None:
        written.append(path)
        if len(written) == cut_at:
            raise KeyboardInterrupt
        real_write(path, text, **how)

    monkeypatch.setattr(export, "_write", write)
    with pytest.raises(KeyboardInterrupt):
        export_site(ledger, out, chunk_runs=1)
    monkeypatch.undo()
    export_site(ledger, out, chunk_runs=1)
    assert _files(out) == _files(whole)


def test_symbolic_links_in_an_earlier_export_are_replaced_not_written_through(ledger, tmp_path):
    """red team: the list, a run page or the index made a link to a file outside had that file overwritten."""
    out = tmp_path / "site"
    export_site(ledger, out)
    outside = {name: tmp_path / f"{name}.txt" for name in ("list", "page", "index")}
    for name, target in outside.items():
        target.write_text(f"the user's {name}")
    for name, where in (("list", EXPORT_LIST), ("page", "runs/run-a.html"), ("index", "index.html")):
        (out / where).unlink()
        (out / where).symlink_to(outside[name])
    export_site(ledger, out)
    assert {name: target.read_text() for name, target in outside.items()} == {
        "list": "the user's list",
        "page": "the user's page",
        "index": "the user's index",
    }
    for where in (EXPORT_LIST, "runs/run-a.html", "index.html"):
        assert not (out / where).is_symlink() and (out / where).stat().st_size > 0, where


def test_a_list_that_is_not_utf8_removes_its_pages_and_ignores_the_rest(ledger, tmp_path):
    """red team: a byte that is not UTF-8 made the export refuse with 'cannot create the export folder' and a codec
    message, though an edited line is otherwise ignored."""
    out, other = tmp_path / "site", tmp_path / "other.sqlite"
    with Ledger(other) as opened:
        add_run(opened, "gone-run", model=SMALL)
    export_site(other, out)
    (out / EXPORT_LIST).write_bytes(b"\xff\xfe runs/x.html\nruns/gone-run.html\n")
    export_site(ledger, out)
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["run-a.html", "run-b.html"]


def test_a_folder_whose_manifest_is_not_an_exports_is_refused(ledger, tmp_path, capsys):
    """red team: any data/manifest.js (a web project's) passed for an earlier export, so its index.html was overwritten."""
    out = tmp_path / "app"
    (out / "data").mkdir(parents=True)
    (out / "data" / "manifest.js").write_text("export default {name: 'my app'};\n")
    (out / "index.html").write_text("my app")
    (out / "runs").mkdir()
    (out / "runs" / "abc.html").write_text("mine")  # newcomer (stop 29): every runs/*.html of a folder was deleted
    with pytest.raises(UsageError, match="holds files that are not an earlier export"):
        export_site(ledger, out)
    rc, _, err = cli(capsys, "view", "--ledger", str(ledger), "--export", str(out))
    assert_one_sentence_error(rc, err)
    assert (out / "index.html").read_text() == "my app" and _files(out) == ["data/manifest.js", "index.html", "runs/abc.html"]
    (out / "data" / "manifest.js").write_text('window.VIEWER_MANIFEST = {"files": [], "total": 0, "page_size": 50};\n')
    export_site(ledger, out)  # an export written before exports listed their files is still one
    (tmp_path / "empty").mkdir()
    export_site(ledger, tmp_path / "empty")  # an empty folder is fine
    assert (out / "runs" / "run-b.html").is_file()


@pytest.mark.parametrize("sub", ["runs", "data", "static"])
def test_a_folder_of_the_export_that_is_a_link_is_refused_and_its_target_untouched(ledger, tmp_path, capsys, sub):
    """red team (stop 29): an export folder whose ``runs/`` was a symbolic link had the listed pages removed from, and
    new ones written into, the link's target, outside the export folder."""
    out, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    export_site(ledger, out)
    (out / sub).rename(elsewhere)
    (out / sub).symlink_to(elsewhere, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    with pytest.raises(UsageError, match=f"{sub} is a symbolic link"):
        export_site(ledger, out)
    rc, _, err = cli(capsys, "view", "--ledger", str(ledger), "--export", str(out))
    assert_one_sentence_error(rc, err)
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before


def test_a_fifo_where_the_export_writes_is_replaced_not_waited_on(ledger, tmp_path):
    """red team (stop 29): a FIFO at ``index.html`` made the export wait forever for a reader."""
    out = tmp_path / "site"
    export_site(ledger, out)
    for where in ("index.html", "data/manifest.js", "runs/run-a.html"):
        (out / where).unlink()
        os.mkfifo(out / where)
    worker = threading.Thread(target=export_site, args=(ledger, out), daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():  # blocked opening a FIFO for writing: a reader on each lets it go, then the test fails
        for where in ("index.html", "data/manifest.js", "runs/run-a.html"):
            if (out / where).is_fifo():
                os.close(os.open(out / where, os.O_RDONLY | os.O_NONBLOCK))
        pytest.fail("the export waited on a FIFO")
    for where in ("index.html", "data/manifest.js", "runs/run-a.html"):
        assert (out / where).is_file() and (out / where).stat().st_size > 0, where


@pytest.mark.parametrize("where", ["index.html", "runs/run-a.html", "static/viewer.css", "data/manifest.js", EXPORT_LIST])
def test_a_hard_link_in_the_export_folder_is_replaced_not_written_through(ledger, tmp_path, where):
    """red team (this stop): a file of the export that is a hard link to a file outside the folder: the export truncated and rewrote the
    file outside (``_write`` opened the existing inode with "w")."""
    out, outside = tmp_path / "site", tmp_path / "notes.txt"
    export_site(ledger, out)
    outside.write_text("the user's own notes\n", encoding="utf-8")
    (out / where).unlink()
    (out / where).hardlink_to(outside)
    export_site(ledger, out)
    assert outside.read_text(encoding="utf-8") == "the user's own notes\n" and (out / where).stat().st_nlink == 1


def test_an_export_folder_name_too_long_is_one_sentence(ledger, tmp_path, capsys):
    """red team (this stop): ``out.exists()`` ran outside the try of ``_prepare``: ENAMETOOLONG (or EACCES on a parent) escaped as a
    traceback."""
    with pytest.raises(OSError):
        (tmp_path / ("a" * 300)).exists()  # the platform refuses the name, as the export then does
    rc, _, err = cli(capsys, "view", "--ledger", ledger, "--export", tmp_path / ("a" * 300))
    assert_one_sentence_error(rc, err)


# stop 31's note: index.html being a folder was said only after every run page was written (and listed)
@pytest.mark.parametrize("page", ["index.html", "pair.html", "data/manifest.js", EXPORT_LIST])
def test_a_folder_where_the_export_writes_a_file_is_refused_before_anything_is_written(ledger, tmp_path, capsys, page):
    out = tmp_path / "site"
    export_site(ledger, out)
    (out / page).unlink()
    (out / page).mkdir()
    before = _files(out)
    rc, _, err = cli(capsys, "view", "--ledger", ledger, "--export", out)
    assert_one_sentence_error(rc, err)
    assert f"{out / page} is a folder where the export writes a file; remove it or pass another folder." in err
    assert _files(out) == before  # nothing removed, nothing written
