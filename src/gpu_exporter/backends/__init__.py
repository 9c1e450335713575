"""GPU backends: one package per vendor (registering itself in ``registry``), behind the protocol in ``base``."""
