"""gpu-exporter: node-level GPU metrics for edge Kubernetes."""

__all__ = ["__version__"]

__version__ = "0.1.0"
