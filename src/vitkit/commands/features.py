"""``vitkit features CHECKPOINT --data SPEC_OR_FOLDER --out DIR``: a data split embedded once
by a frozen ViT, in safetensors shards with a manifest; resumable, and split over ranks under
torchrun."""

from __future__ import annotations

import argparse

from vitkit.backbone import shards
from vitkit.backbone.features import WHAT
from vitkit.commands.options import add_data_options, add_model_option, size
from vitkit.train.distributed import cleanup

NAME = "features"
HELP = "embed a dataset with a frozen ViT: pooled, [CLS], patch tokens, chosen layers, in shards"
DESCRIPTION = ("Stream a dataset split (a data spec or a folder of images) through the model "
               "and store, per image, its pooled embedding (the pre-logits: what the head "
               "reads) and on request the [CLS] token, the other prefix tokens, the patch "
               "tokens and chosen blocks' outputs, as float32 safetensors shards "
               "(features-00000.safetensors, ...) with manifest.json (image paths, labels, "
               "class names, the model and the SHA-256 of its weights, the preprocessing, "
               "what was stored with its shapes). An interrupted run resumes in the same "
               "--out; a folder made with another model, preprocessing, data or --what/--layers "
               "is refused. Under torchrun the ranks split the shards and rank 0 writes. "
               "`vitkit probe --features DIR` reads the folders.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a ViT checkpoint vitkit loads (file, folder or hub id)")
    add_data_options(p, shard_size=shards.SHARD_SIZE)
    p.add_argument("--out", required=True, help="the features folder")
    add_model_option(p)
    p.add_argument("--img-size", type=size, default=None, metavar="N",
                   help="run at N (or HxW) pixels: a rotary model as it is, a position table "
                        "interpolated (default: the checkpoint's size)")
    p.add_argument("--what", default="pooled",
                   help=f"what to store besides the pooled embedding, comma-separated: "
                        f"{', '.join(WHAT[1:])} (default: pooled only)")
    p.add_argument("--layers", default=None,
                   help="also store these blocks' outputs (their patch tokens), e.g. 3,-1 "
                        "(negative: from the last; stored in block order)")


def run(args: argparse.Namespace) -> int:
    try:
        manifest = shards.run(args.checkpoint, args.data, args.out, split=args.split,
                              model_name=args.model_name, img_size=args.img_size,
                              what=args.what, layers=args.layers, batch_size=args.batch_size,
                              shard_size=args.shard_size, limit=args.limit,
                              data_root=args.data_root, device=args.device)
    finally:
        cleanup()
    if manifest is None:  # another rank: rank 0 writes
        return 0
    if manifest["skipped"]:
        first = manifest["skipped"][0]
        print(f"warning: {len(manifest['skipped'])} image(s) could not be read and were left "
              f"out (listed in manifest.json); the first: {first['path']}: {first['error']}")
    stored = ", ".join(f"{k} {tuple(v['shape'])}" for k, v in manifest["stored"].items())
    print(f"{manifest['count']} images embedded: {stored}")
    print(f"wrote {args.out} ({manifest['shards']} shard(s) and {shards.MANIFEST})")
    return 0
