"""kmp's version, apart from `kmp/__init__.py` so that core modules can
read it without importing the whole public API."""

__version__ = "0.1.0"
