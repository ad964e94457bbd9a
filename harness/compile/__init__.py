"""Compiling an exported, mapped model partition by partition."""
