"""When does ext4 count an unlinked file's blocks as free (statvfs), beside a writer?

The reaction benchmark's slow crossings raised the question whether space freed by an
offline deletion shows in ``df`` at once or only with the journal commit that the dir fsync
waits for. This probe answers it on a loop ext4 of its own: fsync'd 16 MiB files, unlinked
one at a time (no fsync), ``statvfs`` polled every ~0.2 ms until the free count has grown by
90 % of the file, first alone, then beside a writer streaming dirty data at ``--rate`` MiB/s
onto the same filesystem. An unlink whose space does not show before the writer has written
as much again (``size / rate`` s) cannot be told apart from the writer's use any more: it is
counted as "not seen at once".

    .venv/bin/python bench/bench_fsfree.py [--trials 60] [--rate 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loopfs
from machine import RESULTS, machine_info

MIB = 1 << 20


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def write_steadily(path: str, rate_mib_s: float, stop: threading.Event) -> None:
    """Append 4 MiB chunks at ``rate_mib_s`` (no fsync: dirty data, as a broker writes);
    start over from empty at 1.5 GiB."""
    chunk = os.urandom(4 * MIB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start, written = time.monotonic(), 0
        while not stop.is_set():
            os.write(fd, chunk)
            written += len(chunk)
            if written >= 1536 * MIB:
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                start, written = time.monotonic(), 0
            ahead = written / (rate_mib_s * MIB) - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    finally:
        os.close(fd)


def seen_after(mount: str, name: str, size: int, window_s: float) -> float | None:
    """Seconds from the unlink of ``name`` until statvfs shows 90 % of ``size`` more free,
    or None if not within ``window_s``."""
    before = free_bytes(mount)
    t0 = time.monotonic()
    os.unlink(os.path.join(mount, name))
    while time.monotonic() - t0 < window_s:
        if free_bytes(mount) - before >= 0.9 * size:
            return time.monotonic() - t0
        time.sleep(0.0002)
    return None


def run(mount: str, rate: float, trials: int, size: int) -> dict[str, Any]:
    names = []
    for i in range(trials):
        name = f"f{rate:g}-{i}"
        with open(os.path.join(mount, name), "wb") as handle:
            handle.write(os.urandom(size))
            handle.flush()
            os.fsync(handle.fileno())
        names.append(name)
    os.sync()
    stop = threading.Event()
    writer = None
    if rate:
        target = os.path.join(mount, "writer")
        writer = threading.Thread(target=write_steadily, args=(target, rate, stop))
        writer.start()
        time.sleep(3)  # dirty data and writeback under way
    window = size / (rate * MIB) if rate else 2.0
    try:
        seen = []
        for name in names:
            seen.append(seen_after(mount, name, size, window))
            time.sleep(0.1)
    finally:
        stop.set()
        if writer is not None:
            writer.join()
            os.unlink(os.path.join(mount, "writer"))
    at_once = [s for s in seen if s is not None]
    return {
        "writer_mib_s": rate,
        "unlinks": trials,
        "file_mib": size // MIB,
        "window_s": round(window, 3),
        "seen_at_once": len(at_once),
        "not_seen_at_once": trials - len(at_once),
        "median_ms": round(statistics.median(at_once) * 1000, 2) if at_once else None,
        "max_seen_ms": round(max(at_once) * 1000, 2) if at_once else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--rate", type=float, default=60.0, help="the writer's MiB/s")
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("--image-dir", default="/var/tmp/diskguard-bench")
    ap.add_argument("--out", default=str(RESULTS / "fsfree.json"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_fsfree needs root (a loop mount)", file=sys.stderr)
        return 2
    image_dir = Path(args.image_dir)
    image_dir.mkdir(parents=True, exist_ok=True)
    mount = image_dir / "fsfree.mnt"
    mount.mkdir(exist_ok=True)
    size = args.size_mib * MIB
    images = image_dir / "fsfree.img"
    with loopfs.loop_fs(images, mount, 4096 * MIB, 65536, reuse=False, keep=False):
        rows = [run(str(mount), rate, args.trials, size) for rate in (0.0, args.rate)]
    for r in rows:
        print(
            f"writer {r['writer_mib_s']:g} MiB/s: {r['unlinks']} unlinks of {r['file_mib']} MiB:"
            f" freed space in statvfs at once (median {r['median_ms']} ms, max"
            f" {r['max_seen_ms']} ms) for {r['seen_at_once']}; not within {r['window_s']} s"
            f" for {r['not_seen_at_once']}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"benchmark": "fsfree", "rows": rows, "machine": machine_info()}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
