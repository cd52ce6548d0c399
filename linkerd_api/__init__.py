"""Linkerd proxy API (io.linkerd.proxy.*) protos and generated Python bindings."""
