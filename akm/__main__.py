"""`python -m akm` and the zipapp entry point."""

from akm.cli import run

if __name__ == "__main__":
    run()
