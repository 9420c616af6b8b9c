import sys
from pathlib import Path

# Test helpers (mpi_util) live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))
