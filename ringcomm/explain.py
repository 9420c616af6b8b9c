"""`python -m ringcomm.explain`: the command lives in ringcomm.selection.explain."""
from .selection.explain import main

if __name__ == "__main__":
    raise SystemExit(main())
