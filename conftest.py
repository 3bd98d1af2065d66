"""Repo-root conftest: puts this checkout first on sys.path so tests use its sources."""
