"""A frozen ViT used as a backbone: its features for a whole data set (in memory, or in a
resumable folder of safetensors shards), and how good they are for a task (the DINOv2
weighted kNN and a logistic-regression linear probe)."""

from vitkit.backbone.features import WHAT, embed, extract
from vitkit.backbone.knn import knn_eval, knn_scores
from vitkit.backbone.linear import linear_probe
from vitkit.backbone.probe import embed_and_probe, probe_features
from vitkit.backbone.shards import read_features, read_manifest, weights_sha256
from vitkit.backbone.shards import run as extract_to_folder

__all__ = ["WHAT", "embed", "embed_and_probe", "extract", "extract_to_folder", "knn_eval",
           "knn_scores", "linear_probe", "probe_features", "read_features", "read_manifest",
           "weights_sha256"]
