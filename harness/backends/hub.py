"""Hugging Face hub file references: ``hf:OWNER/REPO/PATH.gguf[@REVISION]``, parsed without any I/O.

A reference names one GGUF file in a model repository on the Hugging Face hub, at a revision
(a branch, tag or commit; ``main`` when omitted). A model split by llama.cpp's ``gguf-split`` into
``NAME-00001-of-0000M.gguf`` ... ``NAME-0000M-of-0000M.gguf`` is named by its first part; every part
is fetched into the same folder, since llama.cpp loads the first part and finds the rest beside it.

The download itself lives in :mod:`harness.backends.hub_fetch`; this module only describes files.

Digest of a model (what a run records as ``model_digest``): the SHA-256 of its one file, or for a
split model the SHA-256 of its manifest, the text ``"<part sha256>  <part file name>\\n"`` for each
part in order (the ``sha256sum`` listing of the parts). Both are computable from the SHA-256 values
the hub reports per file, before anything is downloaded.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import quote

from harness.errors import UsageError

__all__ = ["HUB_PREFIX", "HubFile", "HubSource", "hub_offline", "is_sha256", "model_digest", "parse_hub_spec", "split_parts"]

#: the prefix of a hub reference inside an ``embedded:`` spec
HUB_PREFIX = "hf:"

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})(?P<of>-of-)(?P<count>\d{5})(?P<ext>\.gguf)$", re.IGNORECASE)
_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class HubFile:
    """One file of a model repository.

    Attributes:
        path: the file's path inside the repository, e.g. ``qwen2.5-0.5b-instruct-q4_k_m.gguf``.
        size: expected size in bytes, or ``None`` when not pinned (the hub's figure is used).
        sha256: expected SHA-256 (lowercase hex), or ``None`` when not pinned (the hub's is used).
    """

    path: str
    size: int | None = None
    sha256: str | None = None

    @property
    def name(self) -> str:
        """The file name without its folders."""
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class HubSource:
    """A GGUF model on the Hugging Face hub: a repository, a revision and its file(s).

    Attributes:
        repo: ``OWNER/NAME`` of the model repository.
        revision: branch, tag or 40-hex commit the files are read at.
        files: the model's files in order; one, or every part of a split model (first part first).
    """

    repo: str
    revision: str
    files: tuple[HubFile, ...]

    @property
    def spec(self) -> str:
        """The reference as written in a spec: ``hf:OWNER/NAME/PATH.gguf@REVISION`` (first part for a split model)."""
        return f"{HUB_PREFIX}{self.repo}/{self.files[0].path}@{self.revision}"

    @property
    def size(self) -> int | None:
        """Total size of the files in bytes, or ``None`` if any size is not pinned."""
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)

    @property
    def digest(self) -> str | None:
        """The model's digest (see the module docstring), or ``None`` if any SHA-256 is not pinned."""
        hashes = [f.sha256 for f in self.files]
        if any(h is None for h in hashes):
            return None
        return model_digest([(f.name, f.sha256 or "") for f in self.files])

    def folder_parts(self) -> tuple[str, ...]:
        """Relative folder (as path parts) of the files in the harness model cache:
        ``hf/OWNER/NAME/REVISION[/folders of PATH]``; the revision is percent-encoded (``refs/pr/1``).
        """
        owner, name = self.repo.split("/")
        inside = PurePosixPath(self.files[0].path).parent.parts
        return ("hf", owner, name, quote(self.revision, safe=""), *inside)


def model_digest(files: list[tuple[str, str]]) -> str:
    """The digest recorded for a model made of ``files`` (``(file name, sha256)`` in order).

    Returns:
        The one file's SHA-256, or for several files the SHA-256 of their ``sha256sum`` listing
        (``"<sha256>  <name>\\n"`` per file), lowercase hex.
    """
    if len(files) == 1:
        return files[0][1]
    listing = "".join(f"{sha}  {name}\n" for name, sha in files)
    return hashlib.sha256(listing.encode("utf-8")).hexdigest()


def parse_hub_spec(reference: str) -> HubSource:
    """Parse ``OWNER/REPO/PATH.gguf[@REVISION]`` (the part after ``hf:``) into a :class:`HubSource`.

    Sizes and SHA-256 values are left unpinned (``None``): the hub reports them at download time.

    Args:
        reference: e.g. ``Qwen/Qwen2.5-7B-Instruct-GGUF/qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf@main``.

    Returns:
        The source; for a split model, one :class:`HubFile` per part.

    Raises:
        UsageError: not of that form, a path segment that is empty, ``.``/``..`` or has odd characters,
            a file that is not ``.gguf``, or a split model named by a part other than its first.
    """
    text, at, revision = reference.partition("@")
    segments = text.split("/")
    problem = _reference_problem(segments, revision if at else "main")
    if problem:
        raise UsageError(
            f"{HUB_PREFIX}{reference} is not a valid Hugging Face file reference ({problem}); "
            f"use {HUB_PREFIX}OWNER/REPO/FILE.gguf[@REVISION], e.g. "
            f"{HUB_PREFIX}Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf."
        )
    repo, path = "/".join(segments[:2]), "/".join(segments[2:])
    return HubSource(repo=repo, revision=revision if at else "main", files=tuple(HubFile(p) for p in split_parts(path)))


def split_parts(path: str) -> list[str]:
    """Every part's path for a split GGUF named by its first part; ``[path]`` for a single file.

    Raises:
        UsageError: ``path`` names a part other than the first, or a part count of zero.
    """
    folder, name = path.rpartition("/")[0], path.rpartition("/")[2]
    match = _SPLIT.match(name)
    if not match:
        return [path]
    index, count = int(match["index"]), int(match["count"])
    if count < 1 or index != 1:
        first = f"{match['stem']}-00001{match['of']}{match['count']}{match['ext']}"
        raise UsageError(
            f"{name} is part {index} of a split GGUF model; name its first part, {first}, and every part is fetched."
        )
    prefix = f"{folder}/" if folder else ""
    # the parts are spelled as the first part is (the hub's file names are case-sensitive)
    return [f"{prefix}{match['stem']}-{i:05d}{match['of']}{match['count']}{match['ext']}" for i in range(1, count + 1)]


def is_sha256(text: str) -> bool:
    """Whether ``text`` is a lowercase hex SHA-256 (64 characters)."""
    return bool(_SHA256.match(text))


def _reference_problem(segments: list[str], revision: str) -> str:
    if len(segments) < 3:
        return "it needs an owner, a repository and a file"
    if any(not _NAME_PART.match(s) or s in (".", "..") for s in segments):
        return "a path segment is empty, '.' or '..', or has characters other than letters, digits, '.', '_' and '-'"
    if not segments[-1].lower().endswith(".gguf"):
        return "the file must be a .gguf file"
    if not revision or any(not _NAME_PART.match(s) for s in revision.split("/")):
        return "the revision after '@' is empty or malformed"
    return ""


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks for no request to the hub (``1``, ``true``, ``yes`` or ``on``, any case), as
    ``huggingface_hub`` reads it."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
