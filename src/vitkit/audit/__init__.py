"""What a model relies on across a dataset: relevance maps for every image, where they sit,
SpRAy clusters per class, and flags confirmed by masking (``vitkit audit``)."""

from vitkit.audit.flags import Flag
from vitkit.audit.run import DEFAULT_METHOD, Audit, audit

__all__ = ["DEFAULT_METHOD", "Audit", "Flag", "audit"]
