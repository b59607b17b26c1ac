"""Helpers the tests share; the fixtures stay in tests/conftest.py."""
