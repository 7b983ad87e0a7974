"""spo: being written (placeholder so the package imports)."""
