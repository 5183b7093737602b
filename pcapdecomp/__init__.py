"""pcapdecomp: where did this query's time go?

One package per pipeline stage, run by analysis.analyze: read/ (captures → exchanges) → pair/ (the points matched,
repaired, their clocks fitted) → explain/ (the slow log joined, network / queueing / execution, the thread pool,
the verdict) → render/ (report.html, the text report, evidence), with run/ (processes, the output folder) around
them and core/ (shared tools), mysql/ (the protocol core) and slowlog/ (the slow log's reader) below them.
"""

__version__ = "0.1.0"
