"""The build's version, read once from the installed package metadata."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("conveyor")
except PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0+unknown"

COMMIT = "unknown"
