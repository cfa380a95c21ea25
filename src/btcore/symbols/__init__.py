"""Naming what was captured: native pcs and Python code through the shared frame cache, ELF
files (native/symbols/)."""
