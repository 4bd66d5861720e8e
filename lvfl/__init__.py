"""lvfl: a PyTorch Lightning framework for vertical federated learning."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lvfl")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"
