"""URIs as they may be shown: in errors, logs, stats and answers, a storage URI's
credentials (``user:secret@`` or a ``secret_key=`` parameter) are replaced by ``***``,
since whoever may read a topic's stats may not hold its object store's keys."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit, urlunsplit

# query parameters of a URI that hold credentials
_SECRET = re.compile(r"(?i)secret|key|token|password|session")


def redacted(uri: str) -> str:
    """``uri`` with its credentials replaced by ``***``."""
    parts = urlsplit(uri)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "&".join(
        f"{name}=***" if _SECRET.search(name) else f"{name}={value}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
