"""Waits on its first run (where a test preempts the pod under it); ends at once on a restart."""
import time

import launcher

ctx = launcher.context()
print("restart", ctx.restart, flush=True)
if ctx.restart == 0:
    time.sleep(3600)
print("done", flush=True)
