"""Only the optional native extension lives here; everything else is in pyproject.toml. A machine without a C
compiler still installs pcapdecomp: the build of the extension may fail, and the pure-Python twins are used."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("pcapdecomp._speedups", ["pcapdecomp/_speedups.c"], optional=True),
    Extension("pcapdecomp._lane", ["pcapdecomp/_lane.c"], optional=True, extra_compile_args=["-O2"]),
])
