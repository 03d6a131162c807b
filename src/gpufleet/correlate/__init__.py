"""Root-cause engine over the topology and the event stream (pure; imports only the domain)."""
