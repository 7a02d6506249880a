"""CFP's profile pass: every plan combination of every unique segment, compiled, timed and stored
(map: ``launcher/cfp/__init__.py``)."""

from launcher.cfp.profile.profiler import Profiler, Profiles

__all__ = ["Profiler", "Profiles"]
