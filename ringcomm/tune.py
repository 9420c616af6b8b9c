"""`python -m ringcomm.tune`: the command lives in ringcomm.selection.tune."""
from .selection.tune import main

if __name__ == "__main__":
    raise SystemExit(main())
