"""The end-to-end bench's producer outside Ray (``end_to_end.py --security remote``):
``ray_producer``'s workload in a program of its own that reaches the cluster through the
REST gateway (``Producer(url=...)``) and never imports Ray, as a web service would.

    python bench/e2e_remote_producer.py TOPIC < SPEC.json

Reads the producer's spec (``end_to_end.run_ray_case``'s, its client settings as a
dict) on stdin; prints its report as one JSON line, with whether Ray was imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from end_to_end import ClientSecurity, ray_producer

    topic, spec = sys.argv[1], json.loads(sys.stdin.read())
    spec["client"] = ClientSecurity(**spec["client"])
    report = ray_producer(topic, spec)
    print(json.dumps({**report, "ray_imported": "ray" in sys.modules}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
