"""Linkerd proxy API .proto files and their generated modules (see scripts/gen_protos.py)."""
