"""GPU backends: one module per vendor library, behind the small protocol in ``base``."""
