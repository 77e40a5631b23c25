"""What a model relies on across a dataset: relevance maps for every image, where they sit,
SpRAy clusters per class, and flags confirmed by masking (``vitkit audit``)."""

from vitkit.audit.analysis import DEFAULT_METHOD, Audit, audit
from vitkit.audit.flags import Flag

__all__ = ["DEFAULT_METHOD", "Audit", "Flag", "audit"]
