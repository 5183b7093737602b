"""Only the optional native extensions live here; everything else is in pyproject.toml. A machine without a C
compiler still installs pcapdecomp: the build of an extension may fail, and the pure-Python twins are used.

The fast lane (pcapdecomp/_lane.c) writes exchange rows column by column. Their layout is declared once, in
pcapdecomp/core/schema.py (EXCHANGE_COLUMNS); every build of the extensions (`pip install .`, `pip install -e .`,
`python3 setup.py build_ext --inplace`) first writes it as the C header pcapdecomp/_lane_columns.h
(schema.c_header), which is not committed."""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
LANE_COLUMNS = HERE / "pcapdecomp" / "_lane_columns.h"


def lane_columns_header() -> str:
    """schema.c_header(), with core/schema.py loaded on its own: a build has setuptools, not pcapdecomp's dependencies."""
    spec = importlib.util.spec_from_file_location("_pcapdecomp_schema", HERE / "pcapdecomp" / "core" / "schema.py")
    schema = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = schema  # dataclasses look their module up while the classes are made
    try:
        spec.loader.exec_module(schema)
    finally:
        del sys.modules[spec.name]
    return schema.c_header()


class BuildExtensions(build_ext):
    def run(self):
        text = lane_columns_header()
        if not LANE_COLUMNS.exists() or LANE_COLUMNS.read_text() != text:
            LANE_COLUMNS.write_text(text)
            self.force = True  # the layout changed: a lane built before must not be kept as up to date
        super().run()


setup(
    cmdclass={"build_ext": BuildExtensions},
    ext_modules=[
        Extension("pcapdecomp._speedups", ["pcapdecomp/_speedups.c"], optional=True),
        Extension("pcapdecomp._lane", ["pcapdecomp/_lane.c"], optional=True, extra_compile_args=["-O2"]),
    ],
)
