"""Kernel-log decoding: dmesg, journalctl -k, /dev/kmsg and nvidia-bug-report into findings.

Public entry points: :class:`gpufleet.diagnose.decoder.Decoder` (streaming, line by line),
:func:`gpufleet.diagnose.reader.decode_stream` (files and stdin, block scanning),
:func:`gpufleet.diagnose.events.finding_to_event` (Finding -> HealthEvent) and
:func:`gpufleet.diagnose.kmsg.parse_kmsg_record` (one ``/dev/kmsg`` record). See docs/diagnose.md.
"""
