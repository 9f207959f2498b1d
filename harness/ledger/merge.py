"""``harness ledger merge OUT LEDGER...``: join the ledgers of a sharded matrix (``harness run --shard I/N``) into a new one.

What the merge does, in order (nothing is written until every check passed; OUT appears whole or not at all):

1. **Refuses** an OUT that exists (a merge writes a new ledger, never into one), an input named twice, an input a
   newer harness wrote (:meth:`harness.ledger.Ledger.newer_schema`: upgrade harness to merge it), and any input
   that is not a fully migrated harness ledger whose checks pass (:meth:`harness.ledger.Ledger.verify`: schema, hash
   chains, row counters, blobs, templates).
2. **Refuses inputs that would not add up**: one scenario (by name) recorded with different content hashes in two
   inputs (the shards ran different scenario files), or two inputs whose newest labels (a turn's newest ``labels``
   row, else its own labels) come from different classifier versions; ``harness rescore --ledger INPUT`` on each input
   first brings them to the current classifier.
3. **Keeps one run per identity** over all inputs: a run with a scored outcome (:func:`harness.vocab.is_scored`)
   beats one without (``infra_error``, ``interrupted``, ``context_overflow``, or no end row); among equals the run
   that ended last by its recorded ``ended_at`` wins (a run with no end row counts as never ended), then the greater
   run id; the very same run in two inputs (a copied ledger) is kept from the first input named. Reports count one
   run per identity in the same way (:mod:`harness.report.frames`), so a sharded matrix merged reports as the
   same matrix run in one ledger, timing aside.
4. **Copies** the kept runs with every row of theirs in every table (``runs``, ``turns``, ``run_ends``, ``labels``,
   ``attempts``, ``attestations``), the blobs they reference and every chat template, input by input in the order
   named, each input's rows in their own order, chaining them anew; and records where each row came from
   (``merge_sources``, ``merge_rows``: :mod:`harness.ledger.merge_origin`), so ``harness ledger verify`` proves the
   carried rows are the inputs' rows and checks an anchor taken on an input against the merged file.
   An input's own ``merge_sources`` and ``merge_rows`` are not carried (their hashes are recorded like any row).
5. **Verifies** the new file like any ledger, then links it in at OUT.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import LedgerError
from harness.ledger.anchor import SIDE_TABLES, LedgerHead, read_head
from harness.ledger.integrity import verify_ledger
from harness.ledger.merge_write import MergeSource, write_merged
from harness.ledger.migrations import CHAINED_TABLES
from harness.ledger.opening import cannot_create, connect_readonly
from harness.ledger.queries import NEWEST_LABELS
from harness.ledger.store import Ledger
from harness.vocab import is_scored

__all__ = ["MergeInput", "MergeResult", "merge_ledgers"]


@dataclass(frozen=True)
class MergeInput:
    """One input ledger as merged.

    Attributes:
        path: the file as named.
        anchor: its head line when merged (``harness ledger head``), recorded in the merged ledger.
        runs: runs it holds.
        kept: of those, runs the merged ledger carries.
    """

    path: Path
    anchor: str
    runs: int
    kept: int


@dataclass(frozen=True)
class MergeResult:
    """What a merge wrote.

    Attributes:
        out: the new ledger.
        inputs: one per input, in the order named.
        runs: runs in the new ledger (one per identity).
        left_out: runs of the inputs not carried (another run of their identity won).
        head: the new ledger's head (:class:`~harness.ledger.anchor.LedgerHead`).
    """

    out: Path
    inputs: list[MergeInput]
    runs: int
    left_out: int
    head: LedgerHead


def merge_ledgers(out: str | Path, inputs: Sequence[str | Path]) -> MergeResult:
    """Merge ``inputs`` into a new ledger at ``out`` (see the module docstring for every rule).

    Args:
        out: where the new ledger goes; must not exist.
        inputs: one or more ledgers, e.g. the shards of one matrix.

    Returns:
        The :class:`MergeResult`.

    Raises:
        LedgerError: one sentence naming the input and the problem (OUT exists, an input is named twice or fails its
            checks, scenario hashes or classifier versions differ); nothing is written then.
    """
    out_path, paths = Path(out), [Path(p) for p in inputs]
    _check_paths(out_path, paths)
    sources: list[MergeSource] = []
    try:
        for index, path in enumerate(paths, 1):
            sources.append(_open_source(index, path))
        _check_scenarios(sources)
        _check_labels(sources)
        kept = _choose_runs(sources)
        head = _write(out_path, sources, kept)
    finally:
        for source in sources:
            source.db.close()
    listed = [MergeInput(s.path, s.head.anchor, s.runs, len(kept[s.index])) for s in sources]
    carried = sum(len(k) for k in kept.values())
    return MergeResult(out_path, listed, carried, sum(s.runs for s in sources) - carried, head)


def _check_paths(out: Path, inputs: list[Path]) -> None:
    if not inputs:
        raise LedgerError("name at least one ledger to merge.")
    for suffix in ("", "-wal", "-journal"):  # a journal left by an earlier ledger of that name would be read into the new one
        found = Path(f"{out}{suffix}")
        if not suffix and found.is_symlink():  # a dangling link too: not a new file, and the link would fail late
            raise LedgerError(
                f"{out} is a symbolic link; `harness ledger merge` writes a new ledger, so pass a path that does not exist."
            )
        if found.exists() and (not suffix or found.stat().st_size > 0):
            raise LedgerError(
                f"{out}{suffix} already exists; `harness ledger merge` writes a new ledger, so pass a path that does not exist."
            )
    problem = cannot_create(out)
    if problem:
        raise LedgerError(problem)
    seen: dict[str | tuple[int, int], Path] = {os.path.realpath(out): out}
    for path in inputs:
        if not path.is_file():
            raise LedgerError(
                f"no ledger at {path}; pass the ledger files of the shards to merge (a shard whose every "
                "run was skipped, its server down, writes none: run it again once the server is up)."
            )
        info = path.stat()
        keys = (os.path.realpath(path), (info.st_dev, info.st_ino))  # the inode: one file under two hard links
        for key in keys:
            if key in seen:
                raise LedgerError(f"{path} is named twice (also as {seen[key]}); name each input ledger once.")
        seen.update(dict.fromkeys(keys, path))


def _open_source(index: int, path: Path) -> MergeSource:
    """Open one input read-only after its checks: fully migrated, verified; read its head and side rows.

    Its checks, its head and every row the merge copies are read in one read transaction: one snapshot of the file,
    so an input a ``harness run`` is still appending to merges as it was at that moment.
    """
    with Ledger(path, readonly=True) as ledger:
        newer = ledger.newer_schema(to="merge it")  # before verify: its sentence would say to restore a sound file
        if newer:
            raise LedgerError(newer)
        pending = ledger.pending_migrations()
        if pending:
            raise LedgerError(
                f"{path} has an older schema ({', '.join(pending)} not applied); run `harness ledger migrate --ledger {path}` "
                "first, then merge."
            )
    db = connect_readonly(path)
    try:
        db.execute("BEGIN")  # held until the connection is closed: every read below and in the copy sees one snapshot
        columns = {t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")] for t in CHAINED_TABLES}
        result = verify_ledger(db, columns)
        if not result.ok:
            raise LedgerError(f"{path} fails verification ({result.problem}); restore it or re-run its shard, then merge.")
        head = read_head(db)
        side_rows = {t: [list(r) for r in db.execute(f"SELECT * FROM {t} ORDER BY rowid")] for t in SIDE_TABLES}
        runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    except sqlite3.Error as exc:
        db.close()
        raise LedgerError(f"{path} cannot be read ({exc}); run `harness ledger verify --ledger {path}`.") from exc
    except BaseException:
        db.close()
        raise
    return MergeSource(index, path, db, head, side_rows, columns, int(runs))


def _check_scenarios(sources: list[MergeSource]) -> None:
    """Refuse one scenario name recorded with different content hashes in two inputs."""
    first: dict[str, tuple[MergeSource, list[str]]] = {}
    for source in sources:
        hashes: dict[str, list[str]] = {}
        for name, digest in source.db.execute(
            "SELECT DISTINCT scenario, scenario_hash FROM runs ORDER BY scenario, scenario_hash"
        ):
            hashes.setdefault(str(name), []).append(str(digest))
        for name, digests in hashes.items():
            if name not in first:
                first[name] = (source, digests)
                continue
            other, theirs = first[name]
            if theirs != digests:
                mine = next(iter(set(digests) - set(theirs)), digests[0])
                raise LedgerError(
                    f"the scenario {name} has content hash {', '.join(d[:12] for d in theirs)} in {other.path} but "
                    f"{mine[:12]} in {source.path}; run every shard with the same scenario files, then merge."
                )


def _check_labels(sources: list[MergeSource]) -> None:
    """Refuse two inputs whose turns' newest labels come from different classifier versions."""
    seen: tuple[MergeSource, list[str]] | None = None
    for source in sources:
        versions = [
            str(v)
            for (v,) in source.db.execute(
                "SELECT DISTINCT COALESCE(l.classifier_version, t.classifier_version) AS v FROM turns t"
                f" LEFT JOIN {NEWEST_LABELS} l USING (run_id, turn) ORDER BY v"
            )
        ]
        if not versions:
            continue
        if seen is None:
            seen = (source, versions)
        elif seen[1] != versions:
            raise LedgerError(
                f"the newest labels of {seen[0].path} come from classifier {', '.join(seen[1])} but those of {source.path} "
                f"from {', '.join(versions)}; run `harness rescore --ledger FILE` on each input first, then merge."
            )


def _choose_runs(sources: list[MergeSource]) -> dict[int, set[str]]:
    """The run ids each input contributes: one run per identity (module docstring, rule 3)."""
    best: dict[str, tuple[tuple[bool, str, str], int, str]] = {}
    owner: dict[str, tuple[int, str]] = {}
    for source in sources:
        rows = source.db.execute(
            "SELECT r.run_id, r.identity, e.outcome, e.ended_at FROM runs r LEFT JOIN run_ends e USING (run_id) ORDER BY r.seq"
        )
        for run_id, identity, outcome, ended_at in rows:
            if run_id in owner and owner[run_id][1] != identity:
                raise LedgerError(
                    f"the run {run_id} has one identity in input {owner[run_id][0]} and another in {source.path}; "
                    "one of them was edited: merge the others."
                )
            owner.setdefault(run_id, (source.index, identity))
            rank = (is_scored(outcome), str(ended_at or ""), str(run_id))
            if identity not in best or rank > best[identity][0]:
                best[identity] = (rank, source.index, str(run_id))
    kept: dict[int, set[str]] = {s.index: set() for s in sources}
    for _rank, index, run_id in best.values():
        kept[index].add(run_id)
    return kept


def _write(out: Path, sources: list[MergeSource], kept: dict[int, set[str]]) -> LedgerHead:
    """Write the merged ledger to a new file beside ``out``, verify it, then link it in at ``out`` (never over a file)."""
    tmp = out.with_name(f".{out.name}.merging-{os.getpid()}")
    try:
        Ledger(tmp).close()  # created and migrated
        try:
            write_merged(tmp, sources, kept)
        except sqlite3.Error as exc:
            raise LedgerError(f"could not write the merged ledger beside {out} ({exc}); nothing was written to {out}.") from exc
        with Ledger(tmp, readonly=True) as merged:
            result, head = merged.verify(), merged.head()
        if not result.ok:  # a bug, not the inputs: they verified
            raise LedgerError(f"the merged ledger fails verification ({result.problem}); nothing was written to {out}.")
        _link(tmp, out)
        return head
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{tmp}{suffix}").unlink(missing_ok=True)


def _link(tmp: Path, out: Path) -> None:
    """Put the finished file at ``out``, never over a file that appeared meanwhile (a hard link fails if it exists)."""
    try:
        os.link(tmp, out)
    except FileExistsError as exc:
        raise LedgerError(f"{out} appeared while merging; nothing was written to it, pass another path.") from exc
    except OSError:  # a file system without hard links
        if out.exists():
            raise LedgerError(f"{out} appeared while merging; nothing was written to it, pass another path.") from None
        os.rename(tmp, out)
