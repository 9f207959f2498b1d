"""The ledger: an append-only, hash-chained SQLite file holding every run and every turn.

``store`` holds :class:`Ledger` (appends and named reads), ``records`` the rows written and
read back, ``migrations`` the schema, ``chain`` the hash chain and its verification. This
package is the only code that knows the tables; see :mod:`harness.ledger.store` for the design.
"""

from harness.canonical import canonical_json
from harness.ledger.anchor import Anchor, LedgerHead, parse_anchor
from harness.ledger.migrations import CHAINED_TABLES
from harness.ledger.opening import cannot_create, file_id, swapped
from harness.ledger.protocol import RunLedger
from harness.ledger.queries import check_failed
from harness.ledger.records import (
    Attempt,
    Attestation,
    IdentityHolder,
    Labels,
    RunEnd,
    RunRow,
    RunStart,
    TurnRecord,
    TurnRow,
    VerifyResult,
    record_fields,
    utc_now,
)
from harness.ledger.report_reads import RUN_EXPORT_COLUMNS
from harness.ledger.store import DEFAULT_LEDGER_PATH, EXPORT_COLUMNS, ClaimPolicy, Ledger, decode_labels
from harness.ledger.viewer_reads import RunFilter

__all__ = [
    "CHAINED_TABLES",
    "DEFAULT_LEDGER_PATH",
    "EXPORT_COLUMNS",
    "RUN_EXPORT_COLUMNS",
    "Anchor",
    "Attempt",
    "Attestation",
    "ClaimPolicy",
    "IdentityHolder",
    "Labels",
    "Ledger",
    "LedgerHead",
    "RunEnd",
    "RunRow",
    "RunFilter",
    "RunLedger",
    "RunStart",
    "TurnRecord",
    "TurnRow",
    "VerifyResult",
    "cannot_create",
    "canonical_json",
    "check_failed",
    "file_id",
    "parse_anchor",
    "record_fields",
    "swapped",
    "utc_now",
    "decode_labels",
]
