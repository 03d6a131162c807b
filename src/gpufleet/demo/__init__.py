"""The self-contained demo: controller + simulated fleet, agents, scheduler and training job."""
