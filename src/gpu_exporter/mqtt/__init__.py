"""MQTT plumbing shared by the agent's forwarder, ``gpu-exporter tail`` and the doctor: the broker's
address and the link settings read from the configuration (``settings``), the paho client built from them
(``client``), the size of a PUBLISH and the bounded read of incoming packets (``packet``), the send
time stamped on a PUBLISH (``sendtime``), and the TLS context for mqtts:// (``tls``)."""
