"""Kernel-log decoding (dmesg, journalctl -k, /dev/kmsg, nvidia-bug-report) into findings and health events."""
