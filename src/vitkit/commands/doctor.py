"""``vitkit doctor TARGET``: diagnose a run folder, a checkpoint or a maps file."""

from __future__ import annotations

import argparse

from vitkit.commands.options import add_model_option, size
from vitkit.diagnose import diagnose, to_json, to_text, worst

NAME = "doctor"
HELP = ("diagnose a run, a checkpoint, attention maps or an audit (the three classic ViT "
        "failures, and shortcuts)")
DESCRIPTION = ("Checks a run folder (small data, recipe, not learning, overfitting, spikes), a "
               "checkpoint (never trained or partly loaded, a re-initialised position table, a "
               "table that does not fit --img-size) or a maps file (averaged heads, last layer "
               "only, uniform rows, sinks) or an audit folder of `vitkit audit` (its confirmed "
               "shortcuts). Each finding: level, numbers, why, and the fix. "
               "Exit code 1 when an error was found.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="a run folder, a checkpoint file or folder, a .npy/.npz of "
                                  "maps (layers, heads, T, T), or an audit folder")
    p.add_argument("--img-size", type=size, default=None,
                   help="the input size the checkpoint will see, e.g. 384 (checks the table)")
    p.add_argument("--image", default=None,
                   help="an image: compute the maps and token norms and check them too")
    p.add_argument("--data", default=None,
                   help="a data spec (e.g. digits): do the same on a few validation images")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    add_model_option(p)


def run(args: argparse.Namespace) -> int:
    findings = diagnose(args.target, img_size=args.img_size, image=args.image, data=args.data,
                        model_name=args.model_name)
    print(to_json(findings, args.target) if args.json else to_text(findings, args.target))
    return 1 if worst(findings) == "error" else 0
