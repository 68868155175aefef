"""Scale of a tiered topic's history: live segment processes and memory while one topic
splits and merges until its DAG holds 1,000 segments, at most 50 of them active.

On an embedded Ray of its own (temporary storage root and ``file://`` tier). The topic
starts with ``--active`` segments and a tiering policy (``afterS`` 0, ``idleS`` 5);
then it alternates a split of a random active segment and a merge of a random adjacent
pair (never above 50 active), producing a few keyed messages after each change, until
the layout has ``--segments`` segments. Every ``--every`` changes it samples: segments
in the layout, active ones, segment actors alive (Ray's actor table) and their
processes' resident memory. At the end it waits for every sealed segment to hibernate
and checks, from the segments' stats (which do not wake them), that every message is
stored exactly once. The peer: the same history without tiering, extrapolated from
the processes' own memory (one process per segment ever made).

    .venv/bin/python bench/tier_scale.py [--segments 1000] [--active 32]

Writes ``bench/results/tier_scale.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results" / "tier_scale.json"
MAX_ACTIVE = 50
MIB = 1 << 20


def segment_processes(prefix: str) -> list[int]:
    """Pids of the alive segment hosts whose name starts with ``prefix``."""
    import ray._private.state as state

    return [
        a["Pid"]
        for a in state.actors().values()
        if a["State"] == "ALIVE" and (a.get("Name") or "").startswith(prefix)
    ]


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return round(total / MIB, 1)


def sample(admin: Any, topic: str, prefix: str, started: float, changes: int) -> dict:
    layout = admin.get_layout(topic)
    pids = segment_processes(prefix)
    return {
        "atS": round(time.monotonic() - started, 1),
        "changes": changes,
        "segments": len(layout.all_segments),
        "active": len(layout.active_segments),
        "segmentProcesses": len(pids),
        "segmentProcessesRssMiB": rss_mib(pids),
        "machineUsedGiB": round(
            (psutil.virtual_memory().total - psutil.virtual_memory().available) / (1 << 30), 2
        ),
    }


def timed_stats(admin: Any, topic: str) -> float:
    """Seconds one ``get_stats`` of the whole DAG takes (hibernating segments answer from
    their records)."""
    started = time.perf_counter()
    admin.get_stats(topic)
    return round(time.perf_counter() - started, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--segments", type=int, default=1000)
    parser.add_argument("--active", type=int, default=32)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tier-scale-"))
    os.environ["RAYTOPICS_STORAGE_ROOT"] = str(scratch / "root")
    os.environ["RAYTOPICS_NAMESPACE"] = f"tier-scale-{uuid.uuid4().hex[:6]}"
    os.environ["RAYTOPICS_TIER_URIS"] = f"file://{scratch / 'tier'}/"
    from runtime import connect

    connect("local", include_dashboard=False, log_to_driver=False)
    from clients import Producer, ScalableTopicsAdmin
    from runtime.names import TopicName
    from runtime.segment_hosts import host_prefix

    rng = random.Random(args.seed)
    admin = ScalableTopicsAdmin()
    topic = "topic://bench/tiers/history"
    prefix = host_prefix(TopicName.parse(topic))
    admin.create_scalable_topic(topic, args.active)
    admin.wait_until_ready(topic, 300)
    uri = f"file://{scratch / 'tier'}/history"
    admin.set_policy(topic, {"tiering": {"uri": uri, "afterS": 0, "idleS": 5}})
    started, changes, sent = time.monotonic(), 0, 0
    samples = [sample(admin, topic, prefix, started, 0)]
    with Producer(topic) as producer:
        while len(admin.get_layout(topic).all_segments) < args.segments:
            active = sorted(
                admin.get_layout(topic).active_segments.values(), key=lambda s: s.hash_range.start
            )
            if changes % 2 == 0 and len(active) < MAX_ACTIVE:
                admin.split_segment(topic, rng.choice(active).segment_id)
            else:
                i = rng.randrange(len(active) - 1)
                admin.merge_segments(topic, active[i].segment_id, active[i + 1].segment_id)
            changes += 1
            keys = [f"k{rng.randrange(1000)}" for _ in range(100)]
            producer.send_batch([k.encode() for k in keys], keys).result(timeout=120)
            sent += len(keys)
            if changes % args.every == 0:
                samples.append(sample(admin, topic, prefix, started, changes))
                print(json.dumps(samples[-1]), flush=True)
    build_s = time.monotonic() - started
    deadline = time.monotonic() + 600
    while True:
        stats = admin.get_stats(topic)
        sealed = [s for s in stats["segments"].values() if s["state"] == "SEALED"]
        if all(s["hibernating"] for s in sealed) or time.monotonic() > deadline:
            break
        time.sleep(2)
    stats_s = timed_stats(admin, topic)
    final = sample(admin, topic, prefix, started, changes)
    per_process = final["segmentProcessesRssMiB"] / max(final["segmentProcesses"], 1)
    result = {
        "segments": final["segments"],
        "active": final["active"],
        "sealedHibernating": sum(1 for s in sealed if s["hibernating"]),
        "sealed": len(sealed),
        "segmentProcesses": final["segmentProcesses"],
        "segmentProcessesRssMiB": final["segmentProcessesRssMiB"],
        "rssPerSegmentProcessMiB": round(per_process, 1),
        "withoutTieringEstimateMiB": round(per_process * final["segments"], 1),
        "maxSegmentProcesses": max(s["segmentProcesses"] for s in samples + [final]),
        "storedRecords": stats["records"],
        "sentRecords": sent,
        "tieredBytes": stats["tieredBytes"],
        "changes": changes,
        "buildSeconds": round(build_s, 1),
        "getStatsSeconds": stats_s,
        "samples": samples + [final],
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    if result["storedRecords"] != sent:
        sys.exit(f"stored {result['storedRecords']} records, sent {sent}")


if __name__ == "__main__":
    main()
