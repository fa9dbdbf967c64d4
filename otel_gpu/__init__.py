"""otel-gpu: observe, diagnose and improve distributed GPU training."""
__version__ = "0.1.0"
