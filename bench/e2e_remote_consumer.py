"""The end-to-end bench's consumer outside Ray (``end_to_end.py --security remote``):
``ConsumerBench`` in a program of its own that reaches the cluster through the REST gateway
(``StreamConsumer(url=...)``) and never imports Ray, as a service far from the cluster would.

    python bench/e2e_remote_consumer.py

Serves its driver (``end_to_end.ConsumerProgram``) over stdin and stdout, one JSON line
each way per call: ``{"call": "start", "args": [topic, name, batch, columnar, config,
client]}`` first, then the consumer's methods (``assigned``, ``received``, ``reset``,
``report``, ``close``). Every answer says whether Ray was imported; an array in it (a
report's latencies, one per message) goes through a ``.npy`` file, which the driver
reads and deletes.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from end_to_end import ClientSecurity, ConsumerBench

    consumer: Any = None
    for line in sys.stdin:
        request = json.loads(line)
        method, args = request["call"], request["args"]
        if method == "start":
            *spec, client = args
            consumer, answer = ConsumerBench(*spec, ClientSecurity(**client)), None
        else:
            answer = getattr(consumer, method)(*args)
        if isinstance(answer, dict):
            answer = {key: _portable(value) for key, value in answer.items()}
        print(json.dumps({"answer": answer, "ray_imported": "ray" in sys.modules}), flush=True)
        if method == "close":
            break
    return 0


def _portable(value: Any) -> Any:
    if not isinstance(value, np.ndarray):
        return value
    with tempfile.NamedTemporaryFile(suffix=".npy", delete=False) as file:
        np.save(file, value)
    return {"npy": file.name}


if __name__ == "__main__":
    sys.exit(main())
