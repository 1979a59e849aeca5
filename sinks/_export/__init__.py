"""``configure(export_process=True)``: every sink run in a child process, fed through a pipe.

The story in one line: the server's bus hands each batch, span handles as they are, to
``ExportProcess``, which writes it as one JSON line to a child running ``configure()`` with the
same arguments on a bus of its own; the child's counters, log lines and flush answers come back
on a report pipe, its ``ready`` and ``closed`` on its stdout.

What lives where (the server's side first, then what both sides share, then the child's):

* ``process``: ``ExportProcess`` (the bus sink: ``handle``, ``stats``, ``aclose``) and
  ``ExportProcessStats``, re-exported by ``ckpt_events.sinks``.
* ``spawn``: the child started with ``configure``'s arguments, its ``ready`` awaited, its close
  budget, its end by force.
* ``replies``: the ``ready`` and ``closed`` lines on the child's stdout, read back.
* ``flush``: the flush protocol, both halves (``FlushRequests``, owned by ``ExportProcess``;
  ``answer_flush`` in the child).
* ``wire``: a batch written as one line and read back as events (``WireReader``).
* ``reports``: the report pipe: ``Progress``, ``Flushed``, ``LogLine``; ``ReportListener`` reads
  it in a thread of the server, ``ReportWriter`` writes it in the child.
* ``child``: ``python -m ckpt_events.sinks._export.child``, the child's main.

Nothing is imported here: ``ckpt_events.sinks`` loads ``process`` on first use of its names.
The loggers keep the names users filter on (``ckpt_events.sinks``), not these modules'.
"""
