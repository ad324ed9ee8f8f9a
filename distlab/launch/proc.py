"""What ``/proc`` says about process groups, for the parent and the workers alike.

Each worker leads a process group of its own (its group id is its pid), and whatever a job
starts (a ``subprocess`` it forgot, a shell pipeline) joins that group. Listing the group
tells a worker what to end after a job, and the parent whether a job left anything running.
"""

from __future__ import annotations

import os


def group_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid``, read from ``/proc`` (empty where there is none)."""
    members = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:  # it ended while we looked
                continue
            if int(fields[2]) == pgid:  # after the name: state, ppid, pgrp, ...
                members.append(int(entry))
    return members
