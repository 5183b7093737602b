"""The ground floor: what every stage shares and nothing of any stage. The declarations of every table and file
(schema), tables and their dtypes (tables), time and group kernels (times, groups), endpoints, number formats,
the error hierarchy, the console, memory between stages, forked workers, and files written as one set (outputs,
readback, dataset)."""
