"""The node agent: devices (nvml, sim), collectors, passive checks, Prometheus exporter, spooled push."""
