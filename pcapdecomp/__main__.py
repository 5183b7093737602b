"""`python3 -m pcapdecomp …`: the `pcapdecomp` command, for a checkout or an environment whose scripts are not on
PATH (the package's own tests and benchmarks run `python3 -m pcapdecomp.cli`, the same thing)."""

from .cli import main

if __name__ == "__main__":
    main()
