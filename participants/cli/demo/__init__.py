"""``ckpt-events demo``: its plan, the run (checkpoint, crash, restore), its checks and logs, its
live view."""
