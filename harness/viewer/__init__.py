"""The transcript viewer (``harness view``): the ledger as web pages, read-only, served on 127.0.0.1
(:mod:`harness.viewer.server`) or written as static files that open from disk (:mod:`harness.viewer.export`).

What each page shows is :mod:`harness.viewer.pages`; every read goes through the ledger's named queries
(:mod:`harness.ledger.viewer_reads`), and every page comes from a Jinja2 template with escaping on.
"""

from harness.viewer.export import export_site
from harness.viewer.server import ViewerServer, open_server

__all__ = ["ViewerServer", "export_site", "open_server"]
