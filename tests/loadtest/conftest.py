"""Make the repository's ``loadtest`` package importable whatever the pytest invocation.

tests/conftest.py puts tests/ first on sys.path, where tests/loadtest/ (no ``__init__.py``) would
otherwise shadow nothing but could confuse a reader: the real package lives at the root.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
