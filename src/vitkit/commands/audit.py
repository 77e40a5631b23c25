"""``vitkit audit --checkpoint C --data SPEC_OR_FOLDER``: what a model relies on across a whole
dataset, with flags confirmed by masking; resumable, and split over ranks under torchrun."""

from __future__ import annotations

import argparse
import sys

from vitkit.audit import store
from vitkit.audit.analysis import CONFIRM_IMAGES, DEFAULT_METHOD
from vitkit.audit.flags import VERDICTS
from vitkit.audit.report import summarise, write
from vitkit.commands.options import add_data_options, add_model_option
from vitkit.explain.methods import METHODS
from vitkit.train.distributed import cleanup

NAME = "audit"
HELP = "what a model relies on across a dataset: SpRAy clusters, shortcuts tested by intervention"
DESCRIPTION = ("Stream a dataset split (a data spec or a folder of images) through the model in "
               "batches: every image's prediction, confidence and relevance map (--method, "
               f"default {DEFAULT_METHOD}), where the relevance sits (border, corners, the "
               "object's box), the map's entropy and high-norm tokens. Cluster each predicted "
               "class's maps (SpRAy); raise hypotheses: a region of any shape where a class's "
               "maps put more relevance than the others', relevance outside the boxes, and the "
               "colour (with brightness and contrast) and texture of a class's images; test "
               "each by intervention (needed, enough, the same pixels), against a control. "
               "Writes "
               "audit.json, audit.csv (sort by suspicion), maps.npz, audit.png, report.html and "
               "images/ to --out; an interrupted run resumes there. Under torchrun the ranks "
               "split the data and rank 0 writes everything.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a ViT classifier vitkit loads")
    add_model_option(p)
    add_data_options(p, shard_size=store.SHARD_SIZE, device="the maps are computed")
    p.add_argument("--method", choices=list(METHODS), default=DEFAULT_METHOD,
                   help=f"the relevance method (default {DEFAULT_METHOD}, the most faithful "
                        "measured)")
    p.add_argument("--out", default="runs/audit", help="the audit folder (default runs/audit)")
    p.add_argument("--max-clusters", type=int, default=8,
                   help="clusters per class at most (default 8; the eigengap chooses)")
    p.add_argument("--confirm-images", type=int, default=CONFIRM_IMAGES,
                   help=f"images changed per class to test a hypothesis (default "
                        f"{CONFIRM_IMAGES})")
    p.add_argument("--seed", type=int, default=0, help="for clustering and masking (default 0)")


def run(args: argparse.Namespace) -> int:
    try:
        result = store.run(args.checkpoint, args.data, args.out, split=args.split,
                           method=args.method, batch_size=args.batch_size,
                           shard_size=args.shard_size, max_clusters=args.max_clusters,
                           confirm_images=args.confirm_images, seed=args.seed,
                           data_root=args.data_root, device=args.device,
                           limit=args.limit, model_name=args.model_name)
        if result is None:  # another rank: rank 0 writes the report
            return 0
        options = store.read_options(args.out)
        files = write(result, result.split, args.out, options)
    finally:
        cleanup()
    warning = summarise(result)["warning"]
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    for f in sorted(result.flags, key=lambda f: VERDICTS.index(f.verdict or "refuted")):
        if f.verdict != "refuted":
            print(f"{'FINDING' if f.confirmed else 'unsettled'}: {f.kind} class {f.cls}: "
                  f"{f.evidence}")
    refuted = sum(f.verdict == "refuted" for f in result.flags)
    if not any(f.confirmed for f in result.flags):
        print("no finding" + (f"; {refuted} hypothesis(es) refuted by the tests" if refuted
                              else ""))
    print("wrote " + ", ".join(str(f) for f in files))
    print(f"browse it: vitkit explore --audit {args.out}")
    return 0
