"""The command line: what a user runs and reads, above everything it launches.

    main.py      python -m launcher / xlaunch: compose the config, validate it, submit, wait
    schema.py    the config's schemas (registered with Hydra) and the checks before submission
    submit.py    from a composed config to a submitted job, and (launcher.wait) to its result
    jobs.py      a submitted job found again from its run dir: its state, logs, stacks, cancel
    commands.py  xlaunch status|logs|cancel|runs|stacks
    console.py   results as the console shows them

Below it (docs/architecture.md, "Floors"): the backends that start the tasks (launcher/clusters/)
and the modes' schemas (launcher/modes/), then what runs in a task.
"""

from launcher.cli.main import main

__all__ = ["main"]
