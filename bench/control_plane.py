"""Control-plane latency: split and merge on an idle topic, and controller failover.

Runs on an embedded local Ray. Each cycle splits an active segment and merges
its two children back; only the admin call is timed, and the next operation
starts once the segments it touches have booted (an idle topic). Sealed
segments' actors are stopped after each cycle so 100 operations fit the
machine (their storage is untouched).

    .venv/bin/python bench/control_plane.py [--ops 50]

Writes bench/results/control_plane.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "control_plane.json"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=50, help="splits and merges each")
    parser.add_argument("--failovers", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", tempfile.mkdtemp(prefix="bench-cp-"))

    import ray

    from actors.control.controller_host import controller_actor
    from actors.guard import guard
    from actors.segment.host import close_segment
    from actors.segment.lookup import find_segment_actor
    from clients import ScalableTopicsAdmin
    from runtime import connect
    from runtime.names import TopicName

    connect(num_cpus=2, include_dashboard=False, log_to_driver=False)
    admin = ScalableTopicsAdmin()
    topic = f"topic://bench/control/plane-{int(time.time())}"
    name = TopicName.parse(topic)
    admin.create_scalable_topic(topic, 1)

    def handles(ids: list[int]) -> list:
        """A split's or merge's children register their actors just after it returns."""
        layout = admin.get_layout(topic)
        infos = [layout.all_segments[i] for i in ids]
        names = [name.segment(i.segment_id, i.hash_range.start, i.hash_range.end) for i in infos]
        return [asyncio.run(find_segment_actor(n)) for n in names]

    def wait_booted(ids: list[int]) -> None:
        ray.get([h.ready.remote() for h in handles(ids)])

    splits, merges, active = [], [], 0
    wait_booted([active])
    for _ in range(args.ops):
        started = time.perf_counter()
        children = admin.split_segment(topic, active)["children"]
        splits.append(time.perf_counter() - started)
        wait_booted(list(children))
        started = time.perf_counter()
        merged = admin.merge_segments(topic, *children)["children"][0]
        merges.append(time.perf_counter() - started)
        wait_booted([merged])
        for handle in handles([active, *children]):  # sealed: closed as hibernation would
            ray.get(close_segment(handle, guard().internal_token()))
        active = merged

    failovers = []
    for _ in range(args.failovers):
        ray.kill(controller_actor(name).host, no_restart=False)
        started = time.perf_counter()
        children = admin.split_segment(topic, active)["children"]
        failovers.append(time.perf_counter() - started)
        wait_booted(list(children))
        active = admin.merge_segments(topic, *children)["children"][0]
        wait_booted([active])

    admin.delete_scalable_topic(topic)
    rows = {
        "split": splits,
        "merge": merges,
        "failover_to_first_split": failovers,
    }
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "ops": args.ops,
        "results_ms": {
            op: {
                "p50": round(percentile(s, 50) * 1000, 1),
                "p99": round(percentile(s, 99) * 1000, 1),
                "mean": round(statistics.mean(s) * 1000, 1),
                "n": len(s),
            }
            for op, s in rows.items()
        },
        "targets_ms": {"split_p50": 200, "failover_to_first_split": 3000},
    }
    print(f"{'operation':<26}{'n':>5}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for op, r in report["results_ms"].items():
        print(f"{op:<26}{r['n']:>5}{r['p50']:>10}{r['p99']:>10}{r['mean']:>10}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
