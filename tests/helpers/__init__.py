"""What test modules share: servers, tenants and clients, CLI runs, receivers, invariants.

Test modules import from here and from nowhere else under tests/ (tests/test_suite_layout.py
fails when a module imports a test module or a conftest); conftest files define fixtures only.
"""
