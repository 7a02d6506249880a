"""CFP's analysis pass: the training step's operator graph, its contractions and their parallel
strategies, ParallelBlocks and the unique segments among them (map: ``launcher/sharding/__init__.py``)."""

from launcher.sharding.analysis.core import Analysis, analyze, analyze_graph

__all__ = ["Analysis", "analyze", "analyze_graph"]
