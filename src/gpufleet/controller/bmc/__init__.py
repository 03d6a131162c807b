"""Out-of-band management through each node's BMC (Redfish): power, boot override, SEL, firmware (docs/bmc.md)."""
