"""``ckpt-events watch``: where it reads from (``/status``, followed logs), what it shows, the command."""
