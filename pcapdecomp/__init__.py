"""pcapdecomp: where did this query's time go?

Pipeline stages, one module each: capture -> tcp -> mysql -> match/clock -> slowlog -> decompose -> report.
"""

__version__ = "0.1.0"
