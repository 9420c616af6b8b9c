"""`python -m ringcomm.simulate`: the command lives in ringcomm.selection.simulate."""
from .selection.simulate import main

if __name__ == "__main__":
    raise SystemExit(main())
