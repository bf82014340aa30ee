"""What the test modules share: SQL helpers (`support.sql`) and capability checks
(`support.capabilities`). The shared fixtures live in `tests/conftest.py`."""
