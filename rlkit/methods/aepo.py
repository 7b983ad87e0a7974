"""aepo: being written (placeholder so the package imports)."""
