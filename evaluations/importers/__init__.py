"""Task importers: datasets of other harnesses in, task folders of SPEC §4 out (SPEC §15)."""
