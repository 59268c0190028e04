"""`corag index --from-faiss` at scale: a flat faiss index of 1M x 768 fp32 vectors (e5-base-v2's width,
3.1 GB, laid out as Search-R1's e5_Flat.index) imported into the project's fp16 exact index, against
faiss's own `read_index` of the same file (what the release's retrieval server does: the whole index in
memory).

Phases run in their own processes, so each peak RSS (VmHWM) is that phase's alone:
- setup: a corpus of as many passages (JSONL, prepared into the store once) and the index, written by
  faiss from random unit vectors added 100,000 at a time;
- baseline: `faiss.read_index` of the file, seconds and peak RSS;
- floor: the peak RSS of a process that loads the same modules and the prepared corpus, and reads no vector;
- import: `corag index CORPUS --out DIR --from-faiss FILE --model e5-base-v2`, seconds and peak RSS;
- check: 200 rows of the imported index against the file's (fp16 rounding only).

Run: nice python benchmarks/faiss_import.py [--rows 1000000] [--dim 768] [--workdir DIR]
About 3 minutes on 2 cores and 8 GB of free disk. The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ADD_ROWS = 100_000


def rss_mb(field: str = "VmHWM") -> float:
    """A memory figure of this process from /proc (VmHWM: the peak RSS), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def phase_setup(work: str, rows: int, dim: int) -> dict:
    import faiss

    from corag.data.corpus import Corpus

    work_dir = Path(work)
    with open(work_dir / "corpus.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": str(i), "contents": f'"Title {i}"\npassage {i}'}) + "\n")
    Corpus.load(work_dir / "corpus.jsonl")
    index = faiss.IndexFlatIP(dim)
    rng = np.random.default_rng(0)
    for start in range(0, rows, ADD_ROWS):
        x = rng.standard_normal((min(ADD_ROWS, rows - start), dim)).astype(np.float32)
        index.add(x / np.linalg.norm(x, axis=1, keepdims=True))
    faiss.write_index(index, str(work_dir / "e5_Flat.index"))
    return {"index_bytes": (work_dir / "e5_Flat.index").stat().st_size}


def phase_baseline(work: str) -> dict:
    import faiss

    start = time.perf_counter()
    index = faiss.read_index(str(Path(work) / "e5_Flat.index"))
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": rss_mb(), "rows": int(index.ntotal)}


def phase_floor(work: str) -> dict:
    """What any import costs before it reads a vector: the modules and the prepared corpus."""
    import faiss  # noqa: F401

    from corag.commands.index import main  # noqa: F401
    from corag.data.corpus import Corpus

    Corpus.load(Path(work) / "corpus.jsonl")
    return {"peak_rss_mb": rss_mb()}


def phase_import(work: str) -> dict:
    from corag.commands.index import main

    work_dir = Path(work)
    start = time.perf_counter()
    argv = [str(work_dir / "corpus.jsonl"), "--out", str(work_dir / "index"), "--model", "e5-base-v2"]
    main([*argv, "--from-faiss", str(work_dir / "e5_Flat.index")])
    seconds = time.perf_counter() - start
    size = sum(p.stat().st_size for p in (work_dir / "index").rglob("*") if p.is_file())
    return {"seconds": seconds, "peak_rss_mb": rss_mb(), "index_bytes": size}


def phase_check(work: str, rows: int) -> dict:
    from corag.retrieval.dense import ExactIndex, index_chunks
    from corag.retrieval.index import faiss_rows, read_faiss_flat

    work_dir = Path(work)
    manifest = json.loads((work_dir / "index" / "manifest.json").read_text())
    exact = ExactIndex(index_chunks(work_dir / "index", manifest))
    flat = read_faiss_flat(work_dir / "e5_Flat.index")
    picked = np.sort(np.random.default_rng(1).choice(rows, 200, replace=False))
    want = np.stack([faiss_rows(flat, r, r + 1)[0] for r in picked.tolist()])
    error = float(np.abs(exact.vectors(picked) - want).max())
    return {"rows_checked": len(picked), "max_abs_error": error, "total": exact.ntotal}


PHASES = {
    "setup": phase_setup,
    "baseline": phase_baseline,
    "floor": phase_floor,
    "import": phase_import,
    "check": phase_check,
}


def run(phase: str, *args) -> dict:
    """Run one phase in a fresh process; its last stdout line is its JSON result."""
    cmd = [sys.executable, __file__, "--phase", phase, json.dumps(list(args))]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"phase {phase} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{phase}: {result}", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one, removed)")
    ap.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    ap.add_argument("args", nargs="?", default="[]", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(PHASES[args.phase](*json.loads(args.args))))
        return
    work = Path(args.workdir or tempfile.mkdtemp(prefix="faiss-import-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        setup = run("setup", str(work), args.rows, args.dim)
        baseline = run("baseline", str(work))
        floor = run("floor", str(work))
        imported = run("import", str(work))
        check = run("check", str(work), args.rows)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "rows": args.rows,
                "dim": args.dim,
                "faiss_index_gb": setup["index_bytes"] / 1e9,
                "imported_index_gb": imported["index_bytes"] / 1e9,
                "import_s": imported["seconds"],
                "import_peak_rss_mb": imported["peak_rss_mb"],
                "import_rss_over_floor_mb": imported["peak_rss_mb"] - floor["peak_rss_mb"],
                "read_index_s": baseline["seconds"],
                "read_index_peak_rss_mb": baseline["peak_rss_mb"],
                "peak_rss_vs_read_index": imported["peak_rss_mb"] / baseline["peak_rss_mb"],
                "peak_rss_vs_faiss_file": imported["peak_rss_mb"] * 2**20 / setup["index_bytes"],
                "rows_checked": check["rows_checked"],
                "max_abs_error_fp16": check["max_abs_error"],
            }
        )
    )


if __name__ == "__main__":
    main()
