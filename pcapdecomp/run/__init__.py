"""How a run of `analyze` runs: the output folder written as one set, the forked children, the warnings and the
memory between stages, the last step that writes summary.json, report.html and the tables (session), and the
extraction on a Dask cluster (cluster)."""
