"""Model ids instead of files: ``hf-hub:ORG/NAME[@REVISION]`` (and ``timm/NAME``, ``ORG/NAME``
that is not a local path) resolved through ``huggingface_hub``'s cache (``HF_HOME``,
``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, revisions). Only weights and configs are fetched; the files
then go through the same safe readers and layout detection as local ones (safetensors preferred,
a pickle-only repo through ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from vitkit.checkpoints.common import CheckpointError

PREFIX = "hf-hub:"
_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")
_FILES = ["*.json", "*.safetensors", "*.bin", "*.pth", "*.pt", "*.npz"]


def is_hub_id(source: str | os.PathLike) -> bool:
    """``hf-hub:ORG/NAME``, or ``ORG/NAME`` that cannot be a local path: neither it nor its
    first folder exists, and it has no checkpoint suffix (so ``runs/typo`` is a missing file,
    not a download)."""
    text = str(source)
    if text.startswith(PREFIX):
        return True
    path = Path(text.partition("@")[0])
    return (bool(_ID.fullmatch(text)) and not path.exists() and not path.parent.exists()
            and path.suffix not in (".safetensors", ".pth", ".pt", ".bin", ".npz", ".ckpt"))


def resolve(source: str) -> Path:
    """The local folder holding the weights and configs of hub id ``source``."""
    repo = source.removeprefix(PREFIX)
    repo, _, revision = repo.partition("@")
    if not _ID.fullmatch(repo):
        raise CheckpointError(f"{source!r} is not a hub id; expected hf-hub:ORG/NAME[@REVISION]")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError as err:
        raise CheckpointError(f"loading {source} needs huggingface_hub: pip install "
                              "huggingface_hub (or pass a local file or folder)") from err
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    try:
        folder = snapshot_download(repo, revision=revision or None, allow_patterns=_FILES,
                                   cache_dir=_cache_dir(), local_files_only=offline)
    except LocalEntryNotFoundError as err:
        why = "HF_HUB_OFFLINE is set" if offline else "the hub is not reachable"
        raise CheckpointError(
            f"{repo}{'@' + revision if revision else ''} is not in the local hub cache "
            f"({_cache_dir()}) and {why}. Download it where there is a network "
            f"(hf download {repo}) and copy the cache folder here (HF_HOME), or pass the "
            "files' folder instead of the id") from err
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise CheckpointError(f"no model {source} on the hub ({err.__class__.__name__}); check "
                              "the id and the revision") from err
    except (HfHubHTTPError, OSError) as err:
        raise CheckpointError(f"downloading {source} failed: {err}") from err
    return Path(folder)


def _cache_dir() -> str:
    """The hub cache as the environment says now (``HF_HUB_CACHE``, else ``HF_HOME``/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME", os.path.join(Path.home(), ".cache", "huggingface"))
    return os.path.join(home, "hub")
