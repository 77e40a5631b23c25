"""How long a user waits for `vitkit doctor`: the command itself, run as a subprocess (cold start
included: a fresh interpreter each time), on each kind of target, round by round so the machine's
drift falls on all alike. With --before SRC (the src/ folder of an older checkout) the same
targets are timed on that code too, in the same rounds.

    .venv/bin/python benchmarks/doctor_latency.py --out benchmarks/results/doctor_latency.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import vitkit
from vitkit.models.bench import machine

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "doctor"


def targets(tmp: Path) -> dict[str, Path]:
    """A vitkit run folder with its checkpoint, a vitkit .safetensors, timm's and the Trainer's
    run folders, a bare timm .pth (read by the torch loader) and a maps file."""
    run = tmp / "run"
    run.mkdir()
    for f in (DATA / "short").iterdir():
        (run / f.name).write_bytes(f.read_bytes())
    model = vitkit.load_model(DATA / "trained.safetensors", verbose=False)
    vitkit.save_model(model, run / "last.safetensors")
    torch.save(model.state_dict(), tmp / "bare_timm.pth")
    with torch.no_grad():
        _, maps = model(torch.randn(1, 3, 32, 32), return_attn=True)
    np.save(tmp / "maps.npy", torch.stack(list(maps))[:, 0].numpy())
    return {"vitkit run folder (+ last.safetensors)": run,
            "vitkit .safetensors": DATA / "trained.safetensors",
            "timm train.py run folder": DATA / "timm-healthy",
            "Hugging Face Trainer run folder": DATA / "hf-healthy",
            "bare timm .pth (torch loader)": tmp / "bare_timm.pth",
            "maps .npy": tmp / "maps.npy"}


def once(target: Path, src: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vitkit", "doctor", str(target)],
                          capture_output=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"vitkit doctor {target} failed: {done.stderr.decode()[-1000:]}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", type=Path, default=None, help="src/ of an older checkout")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    codes = {"now": ROOT / "src"} | ({"before": args.before} if args.before else {})
    with tempfile.TemporaryDirectory() as tmp:
        found = targets(Path(tmp))
        times = {(name, code): [] for name in found for code in codes}
        for r in range(args.rounds):
            for name, target in found.items():
                for code, src in codes.items():
                    if code == "before" and "timm train.py" in name or (
                            code == "before" and "Trainer" in name):
                        continue  # the older doctor did not read those folders
                    times[(name, code)].append(once(target, src))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    head = "| target | seconds (median) | range |" + (" before: median | range |"
                                                        if args.before else "")
    lines = [f"# `vitkit doctor`: seconds a user waits\n\n{machine()}; a fresh `python -m vitkit "
             f"doctor TARGET` each time, {args.rounds} rounds interleaved. Goal: under 3 s on a "
             "run folder or a checkpoint.\n", head,
             "|---|---|---|" + ("---|---|" if args.before else "")]
    for name in found:
        row = f"| {name} |"
        for code in codes:
            t = times[(name, code)]
            row += (f" {statistics.median(t):.2f} | {min(t):.2f}-{max(t):.2f} |" if t
                    else " (not read) | |")
        lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
