"""`python -m akm` and the zipapp entry point."""

from akm.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
