"""Choosing an algorithm: the cost model, the tuning file, the selector and their command-line tools."""
