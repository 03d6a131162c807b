"""ETTR / MFU / MTTF / badput math and the recorder API for training loops (pure)."""
