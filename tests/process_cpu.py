"""Where a run's CPU goes, by kind of process: samples every process's CPU time each
``--every`` seconds until stopped (Ctrl-C or SIGTERM), then prints CPU-seconds per kind
(``ray::<Class>`` for actors and workers, the executable's name otherwise). A process
is counted from its first sample on, so short-lived ones are undercounted; a Ray worker
that never ran an actor stays ``ray::IDLE`` (task workers and boots that went unused).
A per-test view is ``-p tests.cpu_log``.

    .venv/bin/python -m tests.process_cpu --out build/process_cpu.tsv &
    ./dev.sh test; kill %1
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import psutil


def kind(process: psutil.Process) -> str:
    """``ray::SegmentHost`` for a Ray worker (its title), else the program's name
    (``raylet``, ``java``, ``pytest``, a module run with ``-m``, a script's name)."""
    try:
        args = process.cmdline()
    except (psutil.Error, OSError):
        return "?"
    if not args:
        return process.name()
    if args[0].startswith("ray::"):
        return args[0].split(".")[0].split()[0]
    program = Path(args[0]).name
    if program.startswith("python") and len(args) > 1:
        rest = [a for a in args[1:] if not a.startswith("-")]
        if "-m" in args:
            return args[args.index("-m") + 1]
        return Path(rest[0]).name if rest else program
    return program


def sample(seen: dict[int, tuple[str, float, float]]) -> None:
    """Updates pid → (kind, CPU seconds at first sight, CPU seconds now)."""
    for process in psutil.process_iter():
        try:
            times = process.cpu_times()
            used = times.user + times.system
        except (psutil.Error, OSError):
            continue
        if process.pid in seen:
            name, first, _ = seen[process.pid]
            if not _settled(name):  # a Ray worker takes its actor's title once it runs one
                name = kind(process)
            seen[process.pid] = (name, first, used)
        else:
            seen[process.pid] = (kind(process), used, used)


_UNSETTLED = ("default_worker.py", "setup_worker.py", "ray::IDLE", "bash", "sh")


def _settled(name: str) -> bool:
    """Whether a kind is final: a Ray worker starts as ``default_worker.py`` (or
    ``setup_worker.py`` with a runtime environment), is ``ray::IDLE`` while it boots
    and waits, and takes ``ray::<Class>`` when an actor starts in it; a shell's fork may
    exec another program under the same pid (``./dev.sh``'s becomes pytest)."""
    return name not in _UNSETTLED


def report(seen: dict[int, tuple[str, float, float]], out: Path | None) -> str:
    by_kind: dict[str, tuple[float, int]] = {}
    for name, first, now in seen.values():
        spent, count = by_kind.get(name, (0.0, 0))
        by_kind[name] = (spent + now - first, count + 1)
    total = sum(spent for spent, _ in by_kind.values()) or 1.0
    rows = sorted(by_kind.items(), key=lambda item: -item[1][0])
    lines = ["kind\tprocesses\tcpu_s\tshare"]
    lines += [f"{name}\t{count}\t{spent:.1f}\t{spent / total:.1%}" for name, (spent, count) in rows]
    text = "\n".join(lines) + "\n"
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    seen: dict[int, tuple[str, float, float]] = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        while not stop:
            sample(seen)
            time.sleep(args.every)
    except KeyboardInterrupt:
        pass
    sample(seen)
    sys.stdout.write(report(seen, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
