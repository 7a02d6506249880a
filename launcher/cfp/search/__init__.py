"""CFP's search pass: dynamic programming over the profiled segments, then the shortlist and the
searched plan measured on the whole step beside the baselines (map: ``launcher/cfp/__init__.py``)."""

from launcher.cfp.search.dp import predict, search, shortlist

__all__ = ["predict", "search", "shortlist"]
