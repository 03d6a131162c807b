"""GPU device implementations behind one Protocol (:mod:`gpufleet.agent.devices.port`)."""
