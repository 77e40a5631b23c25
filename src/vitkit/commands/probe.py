"""``vitkit probe CHECKPOINT --data SPEC --out DIR`` or ``vitkit probe --features TRAIN_DIR
--val-features VAL_DIR --out DIR``: the DINOv2 weighted kNN and a linear probe of a frozen
backbone's features."""

from __future__ import annotations

import argparse

import torch

from vitkit.backbone import probe
from vitkit.backbone.knn import KS, TEMPERATURE
from vitkit.backbone.linear import parse_grid
from vitkit.commands.options import add_data_options, add_model_option, size
from vitkit.errors import ConfigError
from vitkit.train.distributed import cleanup

NAME = "probe"
HELP = "how good frozen features are: DINOv2 weighted kNN and a logistic-regression probe"
DESCRIPTION = ("Classify the validation split from the training split's frozen features: "
               "kNN by DINOv2's protocol (L2-normalised features, cosine similarity, the top-k "
               f"neighbours vote with weights exp(sim/T), T={TEMPERATURE}; k in "
               f"{', '.join(map(str, KS))}) and scikit-learn's LogisticRegression on the "
               "features as they are, its C chosen on a held-out tenth of the training split "
               "over 1e-4..1e4, refitted on the whole of it; top-1 and top-5. Either embed a "
               "data spec's two splits with CHECKPOINT (into --out/features-train and "
               "features-val, resumable) or read two folders written by `vitkit features`. "
               "Writes probe.json, probe.md and knn.png to --out.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", default=None,
                   help="a ViT checkpoint, with --data (or give --features and --val-features)")
    p.add_argument("--features", default=None, metavar="TRAIN_DIR",
                   help="a features folder of the training split (`vitkit features`)")
    p.add_argument("--val-features", default=None, metavar="VAL_DIR",
                   help="a features folder of the validation split, same model and options")
    p.add_argument("--out", required=True, help="where probe.json, probe.md and knn.png go")
    p.add_argument("--feature", default="pooled",
                   help="which stored array to probe: pooled (default), cls, patch or prefix "
                        "(tokens averaged), or layerN")
    p.add_argument("--k", default=",".join(map(str, KS)),
                   help=f"the neighbour counts, comma-separated (default {','.join(map(str, KS))};"
                        " each capped at the training set's size)")
    p.add_argument("--no-linear", action="store_true", help="kNN only, no linear probe")
    p.add_argument("--c-grid", default=None, metavar="LIST",
                   help="the inverse regularisation strengths C searched on the held-out tenth, "
                        "comma-separated (default 1e-4,1e-3,...,1e4)")
    p.add_argument("--save-model", default=None, metavar="FILE.safetensors",
                   help="also write the backbone with the fitted linear probe as its head: a "
                        "plain classifier checkpoint that predict, attention and audit read")
    add_model_option(p)
    p.add_argument("--img-size", type=size, default=None, metavar="N",
                   help="embed at N pixels (with CHECKPOINT; default: the checkpoint's size)")
    add_data_options(p, required=False, split=False, device="the model and the kNN run")


def _ks(text: str) -> list[int]:
    try:
        ks = [int(k) for k in text.split(",")]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise ConfigError(f"--k takes neighbour counts of 1 or more like 10,20,100,200; got "
                          f"{text!r}")
    return ks


def run(args: argparse.Namespace) -> int:
    ks, grid = _ks(args.k), parse_grid(args.c_grid)
    folders = args.features is not None or args.val_features is not None
    if args.checkpoint and not args.data and not folders:
        raise ConfigError(f"{args.checkpoint}: give --data SPEC, the labelled data whose two "
                          "splits it embeds")
    if folders == (args.checkpoint is not None):
        raise ConfigError("give either CHECKPOINT --data SPEC (to embed both splits), or "
                          "--features TRAIN_DIR --val-features VAL_DIR (folders of "
                          "`vitkit features`), not both")
    if folders and not (args.features and args.val_features):
        raise ConfigError("--features and --val-features go together: the training and the "
                          "validation split's folders")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda asked for, but torch sees no CUDA device")
    knn_device = "cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu"
    if folders:
        record = probe.probe_features(args.features, args.val_features, args.out,
                                      feature=args.feature, ks=ks, linear=not args.no_linear,
                                      grid=grid, device=knn_device,
                                      save_model=args.save_model)
    else:
        try:
            record = probe.embed_and_probe(
                args.checkpoint, args.data, args.out, feature=args.feature, ks=ks,
                linear=not args.no_linear, grid=grid, knn_device=knn_device,
                save_model=args.save_model, model_name=args.model_name,
                img_size=args.img_size, limit=args.limit, batch_size=args.batch_size,
                data_root=args.data_root, device=args.device)
        finally:
            cleanup()
        if record is None:  # another rank
            return 0
    for r in record["knn"]["results"]:
        print(f"kNN k={r['k_used']}: top-1 {r['top1']:.2f}%, top-5 {r['top5']:.2f}%")
    for note in record["knn"]["notes"]:
        print(f"note: {note}")
    if record["linear"] is not None:
        lin = record["linear"]
        print(f"linear probe (C={lin['C']:g}): top-1 {lin['top1']:.2f}%, top-5 {lin['top5']:.2f}%")
        for note in lin["notes"]:
            print(f"note: {note}")
    print(f"wrote {args.out}/probe.json, probe.md and knn.png")
    if record.get("saved_model"):
        print(f"wrote {record['saved_model']} (the backbone with the linear probe as its head)")
    return 0
