"""The run report: reading every process's logs, the model of a checkpoint's spans, the run
overview, trends and ``diff``, and the renderers (terminal, HTML, Perfetto, PNG)."""
