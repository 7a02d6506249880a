"""Steal-aware timing (launcher/sharding/measuring/quiet.py).

The hypervisor cannot be made to steal on demand, so these tests script the steal counter
(``stolen_ticks``) around real measurements; the first reads the real /proc/stat."""

import itertools
import time

from launcher.sharding.measuring import quiet


def read_steal() -> int:
    """The steal field of /proc/stat's aggregate ``cpu`` line, read here on its own: the
    eighth number after the label (user nice system idle iowait irq softirq steal)."""
    with open("/proc/stat") as f:
        label, *numbers = next(line for line in f if line.startswith("cpu ")).split()
    return int(numbers[7])


def test_steal_is_read_from_proc_stat():
    # The counter only grows: quiet's reading lies between two readings of the file taken
    # around it (equal to both on a host that steals nothing, or between calls).
    before = read_steal()
    ticks = quiet.stolen_ticks()
    after = read_steal()
    assert isinstance(ticks, int) and before <= ticks <= after


def scripted(monkeypatch, deltas):
    """stolen_ticks() reads before and after each attempt; ``deltas``: ticks stolen per attempt."""
    readings = itertools.chain.from_iterable((0, d) for d in deltas)
    monkeypatch.setattr(quiet, "stolen_ticks", lambda: next(readings))


def test_an_interrupted_measurement_is_taken_again(monkeypatch):
    scripted(monkeypatch, [500, 0])
    results = iter(["stolen", "clean"])
    assert quiet.quiet(lambda: next(results)) == "clean"


def test_a_quiet_measurement_is_taken_once(monkeypatch):
    scripted(monkeypatch, [1])  # one tick is always allowed
    calls = []
    assert quiet.quiet(lambda: calls.append(1) or len(calls)) == 1


def test_always_interrupted_keeps_the_least_interrupted(monkeypatch):
    scripted(monkeypatch, [900, 300, 600])
    results = iter(["a", "b", "c"])
    # The share stolen is per second measured: attempts of like length (an instant one's length
    # is all scheduling noise, and a 3x longer first call would make "a" the least interrupted).
    assert quiet.quiet(lambda: time.sleep(0.05) or next(results), tries=3) == "b"


def test_without_a_steal_count_it_measures_once(monkeypatch):
    monkeypatch.setattr(quiet, "stolen_ticks", lambda: None)
    calls = []
    quiet.quiet(lambda: calls.append(1))
    assert calls == [1]
