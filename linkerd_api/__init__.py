"""Linkerd proxy API (io.linkerd.proxy.*) protos and generated Python bindings.

A bare `§N` in this package is a section of docs/protocol/linkerd-destination.md.
"""
