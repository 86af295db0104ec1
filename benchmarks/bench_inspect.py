"""Time `draftlab inspect` on a production-shaped Kimi-K2 EAGLE-3 drafter, as a whole process.

The drafter is written as a SPARSE file: a real safetensors header (hidden 7168, intermediate
18432, 64 heads x head_dim 128, vocab 163840, draft vocab 32000, BF16) followed by a data region
that is a hole, so the file has its real ~2.5 GB apparent size but costs no disk. inspect must
read only the header, so this measures exactly what a user waits for.

    python benchmarks/bench_inspect.py [--runs 5] [--keep DIR]

Prints wall time (median, min) and peak RSS of the child process; goal < 0.3 s and < 150 MB.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftlab.formats.eagle3_format import drafter_config, expected_tensor_shapes

KIMI_K2 = dict(
    hidden_size=7168,
    intermediate_size=18432,
    num_attention_heads=64,
    num_key_value_heads=64,
    head_dim=128,
    vocab_size=163840,
    draft_vocab_size=32000,
    max_position_embeddings=131072,
    target_hidden_size=7168,
    aux_layer_ids=[1, 29, 57],
    rope_theta=50000.0,
    torch_dtype="bfloat16",
)
BYTES = {"BF16": 2, "I64": 8, "BOOL": 1}


def write_sparse_drafter(folder: Path) -> Path:
    """config.json + a model.safetensors whose header is real and whose data is a hole."""
    cfg = drafter_config(**KIMI_K2)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in sorted(expected_tensor_shapes(cfg).items()):
        dtype = "I64" if name == "d2t" else "BOOL" if name == "t2d" else "BF16"
        n = BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes with spaces
    path = folder / "model.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)  # the data region stays a hole
    return path


def draftlab_cmd() -> list[str]:
    exe = shutil.which("draftlab")
    return [exe] if exe else [sys.executable, "-m", "draftlab.cli"]


def time_runs(folder: Path, runs: int) -> tuple[list[float], float]:
    cmd = draftlab_cmd() + ["inspect", str(folder), "--json"]
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if out.returncode != 0:
            sys.exit(f"inspect failed: {out.stderr}")
    doc = json.loads(out.stdout)
    assert doc["format"] == "eagle3" and len(doc["tensors"]) == 15, doc["format"]
    # ru_maxrss of children is the largest peak of any waited-for child, in KiB on Linux
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return walls, peak_mb


def heavy_modules_loaded(folder: Path) -> list[str]:
    code = (
        "import sys; from draftlab.cli import main; main(['inspect', sys.argv[1], '--json']);"
        "print(','.join(m for m in ('torch', 'transformers', 'pandas', 'huggingface_hub.hf_api', 'numpy')"
        " if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True)
    return [m for m in out.stderr.strip().splitlines()[-1].split(",") if m] if out.stderr.strip() else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="build the drafter here and keep it")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench_inspect_")) / "kimi-k2-eagle3"
    try:
        path = write_sparse_drafter(folder)
        st = path.stat()
        walls, peak_mb = time_runs(folder, args.runs)
        heavy = heavy_modules_loaded(folder)
        print(f"file: {path} apparent {st.st_size / 1e9:.2f} GB, on disk {st.st_blocks * 512 / 1e6:.2f} MB")
        print(f"inspect wall: median {statistics.median(walls):.3f} s, min {min(walls):.3f} s over {args.runs} runs")
        print(f"inspect peak RSS: {peak_mb:.1f} MB")
        print(f"heavy modules imported by the CLI: {', '.join(heavy) or 'none'}")
        ok = statistics.median(walls) < 0.3 and peak_mb < 150
        print("goal (< 0.3 s, < 150 MB):", "met" if ok else "NOT met")
        if not ok:
            sys.exit(1)
    finally:
        if args.keep is None:
            shutil.rmtree(folder.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
