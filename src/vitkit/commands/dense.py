"""``vitkit dense IMAGE... --checkpoint C --out DIR``: pictures of a backbone's dense features
(the PCA picture, a patch's similarity map, the correspondence with another image) and the raw
patch tokens."""

from __future__ import annotations

import argparse
import sys

from vitkit.checkpoints import load_model
from vitkit.commands.options import add_model_option, size
from vitkit.viz.dense import dense_images

NAME = "dense"
HELP = "dense features: PCA pictures, patch similarity, correspondence, artifact tokens"
DESCRIPTION = ("For each image: the patch tokens after the final norm (tokens.npy), the "
               "high-norm artifact tokens (artifacts.npy, circled in every picture), and on "
               "request the PCA picture of the patch features as in DINOv2's figures "
               "(--pca: pca.png beside the image, pca.npy, foreground.npy), one patch's cosine "
               "similarity with every patch (--similar ROW,COL) and each patch's best match "
               "in another image (--match IMAGE_B). Without --pca, --similar or --match, "
               "--pca is implied. An image that cannot be read is skipped with a message.")


def patch(text: str) -> tuple[int, int]:
    """'3,5' -> (3, 5): a patch's row and column, counted from 0."""
    try:
        row, col = (int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a patch as ROW,COL (counted from 0, e.g. 3,5), got {text!r}") from None
    return row, col


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", help="image files (any format PIL reads) or folders")
    p.add_argument("--checkpoint", required=True, help="any ViT checkpoint vitkit loads")
    add_model_option(p)
    p.add_argument("--out", required=True, help="folder for the pictures and .npy arrays")
    p.add_argument("--pca", action="store_true",
                   help="the PCA picture: foreground split by the first component, then the "
                        "foreground's first three components as RGB (background black)")
    p.add_argument("--shared-basis", action="store_true",
                   help="fit the PCA on the patches of every image together (the same colour "
                        "means the same features in every image; implies --pca); default: each "
                        "image alone")
    p.add_argument("--similar", type=patch, default=None, metavar="ROW,COL",
                   help="the cosine similarity of this patch with every patch (and over the "
                        "--match image)")
    p.add_argument("--match", default=None, metavar="IMAGE_B",
                   help="for each patch, its most similar patch in this image (dense "
                        "correspondence)")
    p.add_argument("--img-size", type=size, default=None, metavar="N",
                   help="run at N (or HxW) pixels: a rotary model as it is, a position table "
                        "interpolated (default: the checkpoint's size)")


def run(args: argparse.Namespace) -> int:
    extra = {"model": args.model_name} if args.model_name else {}
    model = load_model(args.checkpoint, img_size=args.img_size, **extra)
    pca = args.pca or args.shared_basis or (args.similar is None and args.match is None)
    reports = dense_images(model, args.images, args.out, pca=pca, similar=args.similar,
                           match=args.match, shared_basis=args.shared_basis)
    for r in reports:
        if r.error:
            print(f"{r.path}: skipped: {r.error}", file=sys.stderr)
            continue
        gh, gw = r.grid
        print(f"{r.path}: {gh}x{gw} patches")
        if r.explained:
            print(f"  PCA: {r.foreground:.0%} of the patches foreground; explained variance "
                  + ", ".join(f"{v:.3f}" for v in r.explained)
                  + (" (shared basis)" if args.shared_basis else ""))
        said = ", ".join(f"({row}, {col})" for row, col in r.artifacts[:8])
        print(f"  high-norm artifact tokens: {len(r.artifacts)}" + (f": {said}" if said else "")
              + (" ..." if len(r.artifacts) > 8 else ""))
        print("  wrote " + ", ".join(str(f) for f in r.files))
    if all(r.error for r in reports):
        print(f"vitkit dense: error: none of the {len(reports)} images could be read",
              file=sys.stderr)
        return 2
    return 0
