"""Running the stages: on Dask workers (cluster)."""
