"""Measuring clients and the tools built on them: `meshbridge compare` and `meshbridge shadow`."""
