"""`python -m specgen` runs the `specgen` command line."""

from specgen.app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
