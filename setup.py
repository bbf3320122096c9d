# nbdev 3 keeps all settings in pyproject.toml; this shim only lets `pip install -e .` work with older pips.
from setuptools import setup; setup()
