"""The package version: the one place it is written (setup.py and cpp/CMakeLists.txt read it)."""
__version__ = "0.1.0"
