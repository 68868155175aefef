"""What a test's child program reports: its last JSON line on stdout. Ray's own
processes may print to the same stdout after it (a raylet warning, a worker's
log line), so "the last line" is not the result."""

from __future__ import annotations

import json
from typing import Any


def last_json(stdout: str) -> Any:
    """The last line of ``stdout`` that is a JSON object or array."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise AssertionError(f"the child printed no JSON result:\n{stdout[-3000:]}")
