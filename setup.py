"""Only for the optional C extension; everything else is in pyproject.toml.

nsqx._speedups holds two per-message loops of MPUB ingest in C. It is optional: where
it cannot be built (no compiler), the install goes on and nsqx uses the pure-Python
twins (nsqx.speedups), which the tests check give the same results.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("nsqx._speedups", ["src/nsqx/_speedups.c"], optional=True,
                             extra_compile_args=["-O2"])])
