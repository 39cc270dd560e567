"""What the serve tests share: an export base path (BASE/<N>/) to serve."""

import pytest


@pytest.fixture(scope="session")
def served_base(intent_export):
    """The tiny intent export's base path (tests/conftest.py), with its one version folder."""
    base = intent_export.base
    assert [child.name for child in base.iterdir() if child.name.isdigit()] == [intent_export.version_dir.name]
    return base
